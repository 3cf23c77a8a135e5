cat .scratch/HEAD_COMMIT; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
V=$PWD/.scratch/v
echo "== contract prompt"; timeout 170 python3 -m tensorfold.cli contract --gpu --only prompt 2>&1 | grep -v -i warn | tail -12
echo "== gemm head"; timeout 100 python3 -m tensorfold.cli bench gemm --config 2B --rows 512,2048 --json $OUT/gemm-head.json 2>&1 | grep -v -i warn | tail -18
echo "== gemm prev"; (cd $V/prev && PYTHONPATH=/tmp/site:$V/prev timeout 80 python3 -m tensorfold.cli bench gemm --config 2B --rows 2048 --json $OUT/gemm-prev.json) 2>&1 | grep -v -i warn | tail -10
echo "== prefill head"; timeout 100 python3 -m tensorfold.cli bench prefill --config 2B --no-peer --lengths 512,2048,16384 --json $OUT/prefill-head.json 2>&1 | grep -v -i warn | tail -6
echo "== prefill prev"; (cd $V/prev && PYTHONPATH=/tmp/site:$V/prev timeout 90 python3 -m tensorfold.cli bench prefill --config 2B --no-peer --lengths 512,2048,16384 --json $OUT/prefill-prev.json) 2>&1 | grep -v -i warn | tail -6
