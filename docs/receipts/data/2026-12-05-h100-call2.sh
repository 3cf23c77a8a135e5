# GPU plan, call 4: main's kernels per round; scan chains alone (decode, prefill) against main; MoE fold alone.
set -u
ROOT=$PWD
exec > >(tee -a $OUT/plan4.txt) 2>&1
date; nvidia-smi --query-gpu=name --format=csv,noheader
run() { local v=$1; shift; (cd $ROOT/.scratch/v/$v && PYTHONPATH=/tmp/site:$ROOT/.scratch/v/$v "$@" 2>&1 | grep -v -i warn); }
echo "== main: kernels of the recorded rounds"
run main env TAG=main timeout 100 python3 $ROOT/.scratch/kprof_streams.py 2B 1 16 | head -48
date
for v in scan-chains main; do
  echo "== $v: bench decode 2B"
  run $v timeout 120 python3 -m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64 \
    --cache /tmp/tfcache --json $OUT/decode-2b-$v.json | grep -E "tok/s|round"
  date
done
for v in main scan-chains; do
  echo "== $v: bench prefill 2B 2048"
  run $v timeout 100 python3 -m tensorfold.cli bench prefill --config 2B --no-peer --lengths 2048 --max-seconds 20 \
    --cache /tmp/tfcache --json $OUT/prefill-2b-$v.json | grep -E "prefill|tok/s"
  date
done
