# GPU plan, call 1: the dense 2B, main against experiment/combined (scan chains, GEMM codes ahead, quantize in the
# norm and the gated combine, MoE fold). Each variant's package is .scratch/v/<name>/tensorfold: run from there.
set -u
ROOT=$PWD
exec > >(tee -a $OUT/plan1.txt) 2>&1
date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for v in main combined; do
  echo "== $v: bench decode 2B"
  (cd $ROOT/.scratch/v/$v && PYTHONPATH=/tmp/site:$ROOT/.scratch/v/$v timeout 170 python3 -c "import tensorfold; print(tensorfold.__file__)" && \
   PYTHONPATH=/tmp/site:$ROOT/.scratch/v/$v timeout 170 python3 -m tensorfold.cli bench decode --config 2B --no-peer \
    --streams 1,16 --tokens 64 --cache /tmp/tfcache --json $OUT/decode-2b-$v.json 2>&1 | grep -v -i warn | tail -12)
  date
done
for v in combined; do
  echo "== $v: kernels of the recorded 1- and 16-stream rounds"
  (cd $ROOT/.scratch/v/$v && PYTHONPATH=/tmp/site:$ROOT/.scratch/v/$v TAG=$v timeout 120 python3 \
    $ROOT/.scratch/kprof_streams.py 2B 1 16 2>&1 | grep -v -i warn | head -60)
  date
done
