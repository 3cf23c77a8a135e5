# the 35B-A3B's prefill of 2,048 tokens: main (the combine of 897e248) beside base = 82ee351; the host profile again
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
echo "main $(cat .scratch/HEAD_COMMIT); base = 82ee351" | tee $OUT/commit.txt
V=$PWD/.scratch/t; P="-m tensorfold.cli bench prefill --config 35B-A3B --no-peer --lengths 2048"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
{
echo "== contract moe_combine (t=$(el))"; timeout 120 python3 -m tensorfold.cli contract --gpu --only moe_combine 2>&1 | grep -E "PASS|FAIL|SUMMARY|rror"
echo "== main (t=$(el))"; timeout 150 python3 -u $P --json $OUT/prefill-main.json 2>&1 | grep -E "tok/s|rror"
echo "== base (t=$(el))"; (cd $V/base && PYTHONPATH=/tmp/site:$V/base timeout 100 python3 -u $P 2>&1 | grep -E "tok/s|rror")
echo "== main again (t=$(el))"; timeout 100 python3 -u $P --json $OUT/prefill-main-2.json 2>&1 | grep -E "tok/s|rror"
echo "== moe host profile main (t=$(el))"; timeout 150 python3 -u .scratch/moe_host.py 2>&1 | grep -v Warn | head -30
echo "== done (t=$(el))"
} 2>&1 | tee $OUT/callP.txt
