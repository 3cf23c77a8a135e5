# the 35B-A3B's decode: main (its down projection in the whole kernel, no combine) and before = 9a8dd29
echo "main $(cat .scratch/HEAD_COMMIT); before = 9a8dd29" | tee $OUT/commit.txt
V=$PWD/.scratch/t; D="-m tensorfold.cli bench decode --config 35B-A3B --no-peer --streams 1,16 --tokens 64"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
{
echo "== decode 35B main (t=$(el))"; timeout 95 python3 -u $D --json $OUT/d35-main.json 2>&1 | grep -E "round|tok/s|rror" | grep -v "warn("
echo "== decode 35B before (t=$(el))"; (cd $V/m9a && PYTHONPATH=/tmp/site:$V/m9a timeout $(( 190 - $(el) )) python3 -u $D --json $OUT/d35-before.json 2>&1 | grep -E "round|tok/s|rror" | grep -v "warn(")
echo "== done (t=$(el))"
} 2>&1 | tee $OUT/callW.txt
