# main: the scan's GPU contract; decode with overlapped launches off and on, alternating; the scan's log counter
# (main) beside d239a8d (.scratch/t/base), alternating
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt; V=$PWD/.scratch/t
echo "main $(cat .scratch/HEAD_COMMIT)" | tee $OUT/commit.txt
ln -sfn $PWD/tensorfold/models/tiny-shakespeare $V/base/tensorfold/models/tiny-shakespeare
F="NumbaPerformanceWarning|^  warn|grid size|low occupancy"
var() { (cd $V/$1 && PYTHONPATH=/tmp/site:$V/$1 timeout $2 python3 -u "${@:3}") 2>&1 | grep -v -E "$F"; }
here() { (timeout $1 python3 -u "${@:2}") 2>&1 | grep -v -E "$F"; }
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
{
echo "== contract --gpu --only deltanet (t=$(el) s)"; here 100 -m tensorfold.cli contract --gpu --only deltanet | grep -E "^PASS|^FAIL|^SUMMARY|rror" | cut -c1-220
for i in 1 2; do for o in 0 1; do
[ $(el) -gt 400 ] && break
echo "== decode TENSORFOLD_OVERLAP=$o $i (t=$(el) s)"
TENSORFOLD_OVERLAP=$o here 60 -m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64 --json $OUT/decode-overlap$o-$i.json | grep -E "^decode round, 1[6 ]|^drafted|rror|Traceback" | cut -c1-200
done; done
for i in 1 2; do
[ $(el) -gt 480 ] && break
echo "== scan base $i (t=$(el) s)"; var base 30 -m tensorfold.cli bench scan --config 2B --rows 1,16,2048 --json $OUT/scan-base-$i.json | grep -E "^a window|rror"
echo "== scan main $i (t=$(el) s)"; here 30 -m tensorfold.cli bench scan --config 2B --rows 1,16,2048 --json $OUT/scan-main-$i.json | grep -E "^a window|rror"
done
echo "== done (t=$(el) s)"
} 2>&1 | tee $OUT/callD.txt | tail -c 11000
