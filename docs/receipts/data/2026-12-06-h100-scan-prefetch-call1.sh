# The scan variants (.scratch/v8, COMMITS) beside main: bench scan x2, prefill x2 alternating, the GPU contract of the two
# newest, then one decode each of main and prefetch if time allows. Everything under $OUT.
cat .scratch/v8/COMMITS; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; V=$PWD/.scratch/v8
for v in main staging1 staging2 prefetch overlap; do rm -rf $V/$v/tensorfold/models/tiny-shakespeare; ln -sfn $PWD/tensorfold/models/tiny-shakespeare $V/$v/tensorfold/models/tiny-shakespeare; done
var() { (cd $V/$1 && PYTHONPATH=/tmp/site:$V/$1 timeout $2 python3 -u "${@:3}") 2>&1 | grep -v NumbaPerformanceWarning; }
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
{
for i in 1 2; do for v in main staging2 prefetch $([ $i = 1 ] && echo staging1); do
echo "== scan $v $i (t=$(el) s)"
var $v 60 -m tensorfold.cli bench scan --config 2B --rows 1,16,2048 --json $OUT/scan-$v-$i.json | grep -E "^a window|rror"
done; done
for v in main prefetch staging2 main prefetch; do i=$(ls $OUT | grep -c "^prefill-$v-"); i=$((i + 1))
echo "== prefill $v $i (t=$(el) s)"
var $v 90 -m tensorfold.cli bench prefill --config 2B --no-peer --lengths 2048,16384 --json $OUT/prefill-$v-$i.json | grep -E "^cold|rror"
done
for v in prefetch staging2; do
echo "== contract $v deltanet (t=$(el) s)"; var $v 100 -m tensorfold.cli contract --gpu --only deltanet | grep -E "^PASS|^FAIL|^SUMMARY|rror" | cut -c1-220
done
for v in main prefetch; do
[ $(el) -gt 430 ] && break
echo "== decode $v (t=$(el) s)"
var $v 90 -m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64 --json $OUT/decode-$v.json | grep -E "^decode round, 1[6 ]|^drafted|rror|Traceback" | cut -c1-200
done
echo "== done (t=$(el) s)"
} 2>&1 | tee $OUT/callA.txt | tail -c 11000
