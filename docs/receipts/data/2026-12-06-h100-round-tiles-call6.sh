cat .scratch/HEAD_COMMIT; nvidia-smi --query-gpu=name --format=csv,noheader; V=$PWD/.scratch/v2
var() { (cd $V/$1 && PYTHONPATH=/tmp/site:$V/$1 timeout $2 python3 "${@:3}") 2>&1 | grep -v -i warn; }
echo "== contract gemm_affine head"; timeout 100 python3 -m tensorfold.cli contract --gpu --only gemm_affine 2>&1 | grep -v -i warn | tail -5
echo "== contract deltanet head"; timeout 100 python3 -m tensorfold.cli contract --gpu --only deltanet 2>&1 | grep -v -i warn | tail -3
echo "== gemm head"; timeout 60 python3 -m tensorfold.cli bench gemm --config 2B --rows 1 --json $OUT/gemm-head.json 2>&1 | grep -v -i warn | grep -v copy | tail -7
echo "== gemm main6c"; var main6c 60 -m tensorfold.cli bench gemm --config 2B --rows 1 --json $OUT/gemm-main6c.json | grep -v copy | tail -7
for i in 1 2; do
echo "== decode head $i"; timeout 100 python3 -m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64 --json $OUT/decode-head-$i.json 2>&1 | grep -v -i warn | grep -E "^decode round, 1[6 ]|^drafted"
echo "== decode main6c $i"; var main6c 100 -m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64 --json $OUT/decode-main6c-$i.json | grep -E "^decode round, 1[6 ]|^drafted"
done
echo "== done"
