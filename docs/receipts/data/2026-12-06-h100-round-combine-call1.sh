cat .scratch/HEAD_COMMIT; nvidia-smi --query-gpu=name --format=csv,noheader; V=$PWD/.scratch/v2
var() { (cd $V/$1 && PYTHONPATH=/tmp/site:$V/$1 timeout $2 python3 "${@:3}") 2>&1 | grep -v -i warn; }
echo "== contract gemm_affine head"; timeout 120 python3 -m tensorfold.cli contract --gpu --only gemm_affine 2>&1 | grep -v -i warn | tail -5
echo "== contract quantize+deltanet qshuf"; var qshuf 150 -m tensorfold.cli contract --gpu --only quantize | tail -3; var qshuf 100 -m tensorfold.cli contract --gpu --only deltanet | tail -3
echo "== gemm head"; timeout 60 python3 -m tensorfold.cli bench gemm --config 2B --rows 1 --json $OUT/gemm-head.json 2>&1 | grep -v -i warn | grep -v copy | tail -7
echo "== gemm main838"; var main838 60 -m tensorfold.cli bench gemm --config 2B --rows 1 --json $OUT/gemm-main838.json | grep -v copy | tail -7
for i in 1 2; do
for v in head main838 qshuf; do
echo "== decode $v $i"
if [ $v = head ]; then timeout 100 python3 -m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64 --json $OUT/decode-$v-$i.json 2>&1 | grep -v -i warn | grep -E "^decode round, 1[6 ]|^drafted"
else var $v 100 -m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64 --json $OUT/decode-$v-$i.json | grep -E "^decode round, 1[6 ]|^drafted"; fi
done; done
echo "== contract expert head"; timeout 150 python3 -m tensorfold.cli contract --gpu --only expert 2>&1 | grep -v -i warn | tail -4
echo "== done"
