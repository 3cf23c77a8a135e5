# where the 35B-A3B's 2,048-row chunk spends its time now (main); the 2B's host against its device
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
echo "main $(cat .scratch/HEAD_COMMIT)" | tee $OUT/commit.txt
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
{
echo "== profile 35B-A3B (t=$(el))"; timeout 200 python3 -u tools/profile_prefill.py --config 35B-A3B --length 2048 --chunks 2048 --json $OUT/profile-35b.json 2>&1 | grep -v Warn | grep -v "warn(" | tail -30
echo "== host 2B (t=$(el))"; timeout 150 python3 -u .scratch/moe_host.py 2B 2>&1 | grep -E "forward of"
echo "== done (t=$(el))"
} 2>&1 | tee $OUT/callQ.txt
