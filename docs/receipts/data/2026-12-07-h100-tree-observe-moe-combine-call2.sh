# trees' observe without a gather (main = 1f0a787) beside base = 82ee351; then the 35B-A3B prefill's host profile
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
echo "main $(cat .scratch/HEAD_COMMIT); base = 82ee351" | tee $OUT/commit.txt
V=$PWD/.scratch/t; R="-m tensorfold.cli bench drafter --backend cuda --tokens 128"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
{
echo "== drafter main (t=$(el))"; timeout 70 python3 -u $R --json $OUT/drafter-main.json 2>&1 | grep -E "decode|rror"
echo "== drafter base (t=$(el))"; (cd $V/base && PYTHONPATH=/tmp/site:$V/base timeout 70 python3 -u $R --json $OUT/drafter-base.json 2>&1 | grep -E "decode|rror")
echo "== drafter main again (t=$(el))"; timeout 70 python3 -u $R --json $OUT/drafter-main-2.json 2>&1 | grep -E "decode|rror"
echo "== drafter main phases (t=$(el))"; timeout 150 python3 -u $R --phases --prompts 2 2>&1 | grep -E "decode|ms a round|rror"
echo "== moe host profile (t=$(el))"; timeout 200 python3 -u .scratch/moe_host.py 2>&1 | grep -v Warn | head -60
echo "== done (t=$(el))"
} 2>&1 | tee $OUT/callN.txt
