# contract on the GPU for the round tile and the grouped round kernel; the 35B-A3B's decode alternating main / before
# (942b338); the kernels of main's decode round; on a card of 120 GB or more, the 35B-A3B with its peer
echo "main $(cat .scratch/HEAD_COMMIT); before = 942b338, a8c3c8f = the grouped round kernel alone" | tee $OUT/commit.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a $OUT/commit.txt
MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
V=$PWD/.scratch/t; D="-m tensorfold.cli bench decode --config 35B-A3B --no-peer --streams 1,16 --tokens 64"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
{
echo "== contract (t=$(el))"
timeout 150 python3 -u -m tensorfold.cli contract --gpu --only moe_rout 2>&1 | grep -E "PASS|FAIL|SUMMARY|rror"
timeout 150 python3 -u -m tensorfold.cli contract --gpu --only gemm_affine 2>&1 | grep -E "PASS|FAIL|SUMMARY|rror"
if [ "$MIB" -gt 120000 ]; then
echo "== bench all 35B-A3B --peer (t=$(el))"
timeout $(( 450 - $(el) )) python3 -u -m tensorfold.cli bench all --config 35B-A3B --peer --streams 1,16 --lengths 2048 \
  --tokens 32 --json $OUT/bench-35b-peer.json 2>&1 | grep -v "warn(" | grep -v "^ *$" | tail -40
else
echo "== decode 35B main (t=$(el))"; timeout 150 python3 -u $D --json $OUT/d35-main.json 2>&1 | grep -E "round|tok/s|rror" | grep -v "warn("
fi
echo "== decode 35B before (t=$(el))"; (cd $V/m942 && PYTHONPATH=/tmp/site:$V/m942 timeout $(( 470 - $(el) )) python3 -u $D --json $OUT/d35-before.json 2>&1 | grep -E "round|tok/s|rror" | grep -v "warn(")
if [ $(el) -lt 380 ]; then echo "== decode 35B a8c3c8f (t=$(el))"; (cd $V/ma8c && PYTHONPATH=/tmp/site:$V/ma8c timeout $(( 470 - $(el) )) python3 -u $D --json $OUT/d35-a8c.json 2>&1 | grep -E "round|tok/s|rror" | grep -v "warn("); fi
echo "== decode kernels 35B (t=$(el))"
timeout $(( 555 - $(el) )) python3 -u .scratch/moe_prof.py 35B-A3B 2>&1 | grep -v "warn(" | tail -70
echo "== done (t=$(el))"
} 2>&1 | tee $OUT/callA2.txt
