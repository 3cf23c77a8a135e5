echo "main $(cat .scratch/HEAD_COMMIT) (the router's registers cd4945c, the scales loaded ahead f8b3268); before = 976ba23" | tee $OUT/commit.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a $OUT/commit.txt
V=$PWD/.scratch/t
D="-m tensorfold.cli bench decode --no-peer --streams 1,16 --tokens 64"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
{
echo "== contract moe (t=$(el))"; timeout 150 python3 -u -m tensorfold.cli contract --gpu --only moe 2>&1 | grep -E "PASS|FAIL|SUMMARY|rror"
echo "== decode 35B main (t=$(el))"; timeout 130 python3 -u $D --config 35B-A3B --json $OUT/d35-main.json 2>&1 | grep -E "round|tok/s|rror" | grep -v "warn("
echo "== decode 35B before (t=$(el))"; (cd $V/m976 && PYTHONPATH=/tmp/site:$V/m976 timeout 100 python3 -u $D --config 35B-A3B --json $OUT/d35-before.json 2>&1 | grep -E "round|tok/s|rror" | grep -v "warn(")
echo "== decode 2B main (t=$(el))"; timeout 90 python3 -u $D --config 2B --json $OUT/d2b-main.json 2>&1 | grep -E "round|tok/s|rror" | grep -v "warn("
echo "== decode 2B before (t=$(el))"; (cd $V/m976 && PYTHONPATH=/tmp/site:$V/m976 timeout 80 python3 -u $D --config 2B --json $OUT/d2b-before.json 2>&1 | grep -E "round|tok/s|rror" | grep -v "warn(")
echo "== decode 35B main again (t=$(el))"; timeout 100 python3 -u $D --config 35B-A3B --json $OUT/d35-main2.json 2>&1 | grep -E "round|tok/s|rror" | grep -v "warn("
if [ $(el) -lt 400 ]; then echo "== contract gemm (t=$(el))"; timeout $(( 500 - $(el) )) python3 -u -m tensorfold.cli contract --gpu --only gemm 2>&1 | grep -E "PASS|FAIL|SUMMARY|rror"; fi
echo "== done (t=$(el))"
} 2>&1 | tee $OUT/call3.txt
