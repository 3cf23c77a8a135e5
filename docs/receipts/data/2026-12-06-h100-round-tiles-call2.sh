cat .scratch/HEAD_COMMIT; nvidia-smi --query-gpu=name --format=csv,noheader; V=$PWD/.scratch/v2
var() { (cd $V/$1 && PYTHONPATH=/tmp/site:$V/$1 timeout $2 python3 "${@:3}") 2>&1 | grep -v -i warn; }
echo "== one head"; timeout 40 python3 .scratch/gemm_one.py 2>&1 | grep -v -i warn | tail -1
echo "== one main6c"; var main6c 40 $PWD/.scratch/gemm_one.py | tail -1
echo "== prefill head"; timeout 90 python3 -m tensorfold.cli bench prefill --config 2B --no-peer --lengths 512,2048,16384 --json $OUT/prefill-head.json 2>&1 | grep -v -i warn | tail -5
echo "== prefill main6c"; var main6c 90 -m tensorfold.cli bench prefill --config 2B --no-peer --lengths 512,2048,16384 --json $OUT/prefill-main6c.json | tail -5
echo "== prefill scan"; var scan 90 -m tensorfold.cli bench prefill --config 2B --no-peer --lengths 512,2048,16384 --json $OUT/prefill-scan.json | tail -5
echo "== contract deltanet scan"; var scan 100 -m tensorfold.cli contract --gpu --only deltanet | tail -4
echo "== contract gemm_affine head"; timeout 130 python3 -m tensorfold.cli contract --gpu --only gemm_affine 2>&1 | grep -v -i warn | tail -6
echo "== bench gemm head"; timeout 60 python3 -m tensorfold.cli bench gemm --config 2B --rows 512,2048 --json $OUT/gemm-head.json 2>&1 | grep -v -i warn | tail -16
echo "== done"
