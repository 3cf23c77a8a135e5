cat .scratch/HEAD_COMMIT; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; V=$PWD/.scratch/v4
var() { (cd $V/$1 && PYTHONPATH=/tmp/site:$V/$1 timeout $2 python3 "${@:3}") 2>&1; }
{
echo "== contract gemm (fused)"; var fused 240 -m tensorfold.cli contract --gpu --only gemm | grep -E "^PASS|^FAIL|^SUMMARY|rror"
for i in 1 2; do
for v in main fused; do
echo "== decode $v $i"; var $v 120 -m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64 --json $OUT/decode-$v-$i.json | grep -E "^decode round, 1[6 ]|^drafted|rror"
done; done
for v in main fused; do
echo "== prefill $v"; var $v 150 -m tensorfold.cli bench prefill --config 2B --no-peer --lengths 2048,16384 --json $OUT/prefill-$v.json | grep -E "tok/s|rror" | tail -4
done
echo "== pytest gemm+graphs (fused = the working tree, recordings on)"; TENSORFOLD_GRAPHS=1 timeout 200 python3 -m pytest -q -n 0 -p no:cacheprovider --gpu tests/test_gemm.py tests/test_graphs.py 2>&1 | tail -3
echo "== prof fused"; var fused 200 $PWD/.scratch/prof.py 2B | grep -v -i warn; cp $OUT/prof-rounds.json $OUT/prof-fused.json
echo "== done"
} 2>&1 | tee $OUT/call2.txt | tail -c 11000
