# GPU plan, call 2 of this stop: the whole suite under pytest --gpu at HEAD (recordings on), then the exact GEMM's
# step of two words (no zero A rows) for every round, or for 9 to 16 rows only, against HEAD.
set -u
ROOT=$PWD
START=$(date +%s)
exec > >(tee -a $OUT/plan10.txt) 2>&1
date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import numba_cuda, numpy, torch, transformers, pytest; print('numba-cuda', numba_cuda.__version__, 'numpy', numpy.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, 'pytest', pytest.__version__)"
run() { local v=$1; shift; (cd $ROOT/.scratch/v/$v && PYTHONPATH=/tmp/site:$ROOT/.scratch/v/$v "$@" 2>&1 | grep -v -i warn); }
echo "== HEAD: pytest --gpu, the whole suite, recordings on (TENSORFOLD_GRAPHS=1)"
TENSORFOLD_GRAPHS=1 timeout 420 python3 -m pytest --gpu -n 14 -p no:cacheprovider -v --durations=30 \
  --junitxml=$OUT/junit-gpu.xml 2>&1 | grep -v -i "warn" > $OUT/pytest-gpu.log
echo "pytest rc ${PIPESTATUS[0]}"
grep -E "FAILED|ERROR" $OUT/pytest-gpu.log | head -30
tail -45 $OUT/pytest-gpu.log
date
for v in w2 w2-16 head; do
  left=$(( 575 - ($(date +%s) - START) ))
  [ $left -lt 40 ] && { echo "== $v: skipped, $left s left"; continue; }
  echo "== $v: bench decode 2B"
  run $v timeout $left python3 -m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64 \
    --cache /tmp/tfcache --json $OUT/decode-2b-$v.json | grep -E "^#   |^drafted"
  date
done
