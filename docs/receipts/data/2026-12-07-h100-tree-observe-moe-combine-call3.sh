# the block drafter's staged rows (main) beside nostage = 897e248, alternating;
# the MoE combine's contract on the GPU
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
echo "main $(cat .scratch/HEAD_COMMIT); nostage = 897e248" | tee $OUT/commit.txt
V=$PWD/.scratch/t; R="-m tensorfold.cli bench drafter --backend cuda --tokens 128"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
{
echo "== contract moe_combine (t=$(el))"; timeout 120 python3 -m tensorfold.cli contract --gpu --only moe_combine 2>&1 | grep -E "PASS|FAIL|SUMMARY|rror"
echo "== drafter main (t=$(el))"; timeout 70 python3 -u $R --json $OUT/drafter-main.json 2>&1 | grep -E "decode|rror"
echo "== drafter nostage (t=$(el))"; (cd $V/nostage && PYTHONPATH=/tmp/site:$V/nostage timeout 70 python3 -u $R --json $OUT/drafter-nostage.json 2>&1 | grep -E "decode|rror")
echo "== drafter main again (t=$(el))"; timeout 70 python3 -u $R --json $OUT/drafter-main-2.json 2>&1 | grep -E "decode|rror"
echo "== drafter nostage again (t=$(el))"; (cd $V/nostage && PYTHONPATH=/tmp/site:$V/nostage timeout 70 python3 -u $R --json $OUT/drafter-nostage-2.json 2>&1 | grep -E "decode|rror")
echo "== drafter main phases (t=$(el))"; timeout 150 python3 -u $R --phases --prompts 2 2>&1 | grep -E "decode|ms a round|rror"
echo "== done (t=$(el))"
} 2>&1 | tee $OUT/callO.txt
