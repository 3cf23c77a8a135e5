# the router's batches and the tile table on the GPU: contract, the 35B-A3B's decode alternating main / 5e8447b,
# the 2B's decode (main), main's decode kernels
echo "main $(cat .scratch/HEAD_COMMIT); prev = 5e8447b; before = 942b338" | tee $OUT/commit.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a $OUT/commit.txt
V=$PWD/.scratch/t; D="-m tensorfold.cli bench decode --config 35B-A3B --no-peer --streams 1,16 --tokens 64"
D2="-m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
{
echo "== contract (t=$(el))"
timeout 120 python3 -u .scratch/contract_some.py moe_route moe_expert_groups moe_routed_experts4 2>&1 | grep -E "PASS|FAIL|rror"
echo "== decode 35B main (t=$(el))"; timeout 120 python3 -u $D --json $OUT/d35-main.json 2>&1 | grep -E "round|tok/s|rror" | grep -v "warn("
echo "== decode 35B prev (t=$(el))"; (cd $V/m5e8 && PYTHONPATH=/tmp/site:$V/m5e8 timeout 100 python3 -u $D --json $OUT/d35-prev.json 2>&1 | grep -E "round|tok/s|rror" | grep -v "warn(")
echo "== decode kernels 35B (t=$(el))"
timeout $(( 330 - $(el) )) python3 -u .scratch/moe_prof.py 35B-A3B 2>&1 | grep -v "warn(" | grep -v "Warning\|_warn" | tail -60
if [ $(el) -lt 300 ]; then echo "== decode 2B main (t=$(el))"; timeout 80 python3 -u $D2 --json $OUT/d2b-main.json 2>&1 | grep -E "round|tok/s|rror" | grep -v "warn("; fi
echo "== done (t=$(el))"
} 2>&1 | tee $OUT/callB2.txt
