# deltanet_apply a thread per 8 elements of a column (apply8, experiment/apply-elements) beside main; the block
# drafter's staged extends (defer, branch deferred-observe) beside main
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
echo "main $(cat .scratch/HEAD_COMMIT); apply8 = 54cf74c; defer = 4ea3258" | tee $OUT/commit.txt
F="NumbaPerformanceWarning|^  warn|grid size|low occupancy"; V=$PWD/.scratch/t
var() { (cd $V/$1 && PYTHONPATH=/tmp/site:$V/$1 timeout $2 python3 -u "${@:3}") 2>&1 | grep -v -E "$F"; }
here() { (timeout $1 python3 -u "${@:2}") 2>&1 | grep -v -E "$F"; }
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
S="-m tensorfold.cli bench scan --config 2B --rows 1,16,2048"
D="-m tensorfold.cli bench decode --config 2B --no-peer --streams 1 --tokens 64"
R="-m tensorfold.cli bench drafter --backend cuda --tokens 128"
{
echo "== scan main (t=$(el) s)"; here 30 $S | grep -E "^a window|rror"
echo "== scan apply8 (t=$(el) s)"; var apply8 30 $S | grep -E "^a window|rror"
echo "== contract apply8 (t=$(el) s)"; var apply8 60 -m tensorfold.cli contract --gpu --only deltanet_apply | grep -E "^PASS|^FAIL|^SUMMARY|rror" | cut -c1-200
echo "== drafter defer (t=$(el) s)"; var defer 110 $R --json $OUT/drafter-defer.json | grep -E "decode|rror"
echo "== drafter main (t=$(el) s)"; here 110 $R --json $OUT/drafter-main.json | grep -E "decode|rror"
[ $(el) -lt 200 ] && { echo "== decode apply8 (t=$(el) s)"; var apply8 60 $D --json $OUT/decode-apply8.json | grep -E "tok/s|round|rror" | head -8; }
[ $(el) -lt 240 ] && { echo "== decode main (t=$(el) s)"; here 60 $D --json $OUT/decode-main.json | grep -E "tok/s|round|rror" | head -8; }
echo "== done (t=$(el) s)"
} 2>&1 | tee $OUT/callK.txt
