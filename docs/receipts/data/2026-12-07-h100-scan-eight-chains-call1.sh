# the scan's sums as eight chains (branch experiment/scan-eight-chains, .scratch/t/scan8) beside main, alternating
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt; V=$PWD/.scratch/t
echo "main $(git rev-parse --short HEAD 2>/dev/null || cat .scratch/HEAD_COMMIT)" | tee $OUT/commit.txt
F="NumbaPerformanceWarning|^  warn|grid size|low occupancy"
var() { (cd $V/$1 && PYTHONPATH=/tmp/site:$V/$1 timeout $2 python3 -u "${@:3}") 2>&1 | grep -v -E "$F"; }
here() { (timeout $1 python3 -u "${@:2}") 2>&1 | grep -v -E "$F"; }
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
{
for i in 1 2; do
echo "== scan main $i (t=$(el) s)"; here 30 -m tensorfold.cli bench scan --config 2B --rows 1,16,2048 | grep -E "^a window|rror"
echo "== scan scan8 $i (t=$(el) s)"; var scan8 30 -m tensorfold.cli bench scan --config 2B --rows 1,16,2048 | grep -E "^a window|rror"
done
echo "== contract scan8 (t=$(el) s)"; var scan8 60 -m tensorfold.cli contract --gpu --only deltanet_scan | grep -E "^PASS|^FAIL|^SUMMARY|rror" | cut -c1-200
[ $(el) -lt 110 ] && { echo "== prefill scan8 (t=$(el) s)"; var scan8 40 -m tensorfold.cli bench prefill --config 2B --no-peer --lengths 2048 | grep -E "^cold|rror"; }
[ $(el) -lt 140 ] && { echo "== prefill main (t=$(el) s)"; here 40 -m tensorfold.cli bench prefill --config 2B --no-peer --lengths 2048 | grep -E "^cold|rror"; }
echo "== done (t=$(el) s)"
} 2>&1 | tee $OUT/callE.txt
