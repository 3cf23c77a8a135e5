cat .scratch/HEAD_COMMIT; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; V=$PWD/.scratch/v4
var() { (cd $V/$1 && PYTHONPATH=/tmp/site:$V/$1 timeout $2 python3 "${@:3}") 2>&1; }
{
echo "== contract gemm (rt1a)"; var rt1a 240 -m tensorfold.cli contract --gpu --only gemm | grep -E "^PASS|^FAIL|^SUMMARY|rror"
for i in 1 2; do
for v in main rt1a rt1b; do
echo "== decode $v $i"; var $v 120 -m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64 --json $OUT/decode-$v-$i.json | grep -E "^decode round, 1[6 ]|^drafted|rror"
done; done
echo "== gemm rows 16 (rt1a, main)"; for v in rt1a main; do var $v 100 -m tensorfold.cli bench gemm --config 2B --rows 16 --json $OUT/gemm16-$v.json | grep -v -i warn | tail -9; done
echo "== prof rt1a"; var rt1a 200 $PWD/.scratch/prof.py 2B | grep -v -i warn | head -60; cp $OUT/prof-rounds.json $OUT/prof-rt1a.json; rm $OUT/prof-rounds.json
echo "== done"
} 2>&1 | tee $OUT/call3.txt | tail -c 11000
