echo "main $(cat .scratch/HEAD_COMMIT) (the router's registers cd4945c, the scales loaded ahead f8b3268); before = 976ba23" | tee $OUT/commit.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a $OUT/commit.txt
V=$PWD/.scratch/t
D="-m tensorfold.cli bench decode --no-peer --streams 1,16 --tokens 64"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
F="grep -v warn( "
{
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  echo "== bench all 35B-A3B --peer, main (t=$(el))"
  timeout 330 python3 -u -m tensorfold.cli bench all --config 35B-A3B --peer --streams 1,16 --lengths 2048 --tokens 32 --json $OUT/all35-main.json 2>&1 | grep -v "warn(" | grep -v "Warning" | tail -40
else
  echo "== decode 35B main (t=$(el))"; timeout 130 python3 -u $D --config 35B-A3B --json $OUT/d35-main.json 2>&1 | grep -E "round|tok/s|rror" | grep -v "warn("
fi
echo "== decode 35B before (t=$(el))"; (cd $V/m976 && PYTHONPATH=/tmp/site:$V/m976 timeout 100 python3 -u $D --config 35B-A3B --json $OUT/d35-before.json 2>&1 | grep -E "round|tok/s|rror" | grep -v "warn(")
echo "== decode 35B main (t=$(el))"; timeout 100 python3 -u $D --config 35B-A3B --json $OUT/d35-main2.json 2>&1 | grep -E "round|tok/s|rror" | grep -v "warn("
if [ $(el) -lt 440 ]; then echo "== decode 2B main (t=$(el))"; timeout 70 python3 -u $D --config 2B --json $OUT/d2b-main.json 2>&1 | grep -E "round|tok/s|rror" | grep -v "warn("; fi
if [ $(el) -lt 490 ]; then echo "== decode 2B before (t=$(el))"; (cd $V/m976 && PYTHONPATH=/tmp/site:$V/m976 timeout 60 python3 -u $D --config 2B --json $OUT/d2b-before.json 2>&1 | grep -E "round|tok/s|rror" | grep -v "warn("); fi
echo "== done (t=$(el))"
} 2>&1 | tee $OUT/call4.txt
