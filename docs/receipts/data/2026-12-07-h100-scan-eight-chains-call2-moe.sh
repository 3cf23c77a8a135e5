# the 35B-A3B preset with overlapped launches on (the default since d071b68)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
echo "main $(cat .scratch/HEAD_COMMIT)" | tee $OUT/commit.txt
F="NumbaPerformanceWarning|^  warn|grid size|low occupancy"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
{
echo "== decode 35B-A3B (t=$(el) s)"; timeout 300 python3 -u -m tensorfold.cli bench decode --config 35B-A3B --no-peer --streams 1,16 --tokens 32 --draft-rows 1 2>&1 | grep -v -E "$F" | tail -25
echo "== prefill 35B-A3B (t=$(el) s)"; timeout 200 python3 -u -m tensorfold.cli bench prefill --config 35B-A3B --no-peer --lengths 2048 2>&1 | grep -v -E "$F" | tail -12
echo "== done (t=$(el) s)"
} 2>&1 | tee $OUT/callF.txt
