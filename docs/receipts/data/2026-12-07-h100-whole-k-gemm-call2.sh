# the 2B's prefill: before = 9a8dd29 and main alternating (the call before ran out of time at before)
echo "main $(cat .scratch/HEAD_COMMIT); before = 9a8dd29" | tee $OUT/commit.txt
V=$PWD/.scratch/t; P="-m tensorfold.cli bench prefill --no-peer"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
{
echo "== 2B before (t=$(el))"; (cd $V/m9a && PYTHONPATH=/tmp/site:$V/m9a timeout 50 python3 -u $P --config 2B --lengths 2048,16384 --json $OUT/p2b-before-1.json 2>&1 | grep -E "tok/s|rror" | grep -v "warn(")
echo "== 2B main (t=$(el))"; timeout 50 python3 -u $P --config 2B --lengths 2048,16384 --json $OUT/p2b-main-2.json 2>&1 | grep -E "tok/s|rror" | grep -v "warn("
[ $(el) -lt 100 ] && { echo "== 2B before (t=$(el))"; (cd $V/m9a && PYTHONPATH=/tmp/site:$V/m9a timeout 50 python3 -u $P --config 2B --lengths 2048,16384 --json $OUT/p2b-before-2.json 2>&1 | grep -E "tok/s|rror" | grep -v "warn("); }
echo "== done (t=$(el))"
} 2>&1 | tee $OUT/callV.txt
