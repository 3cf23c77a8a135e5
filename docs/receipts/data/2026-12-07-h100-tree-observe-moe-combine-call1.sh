# the 35B-A3B's prefill of 2,048 tokens: main, b6a818a (2,856 then) and 879bdc5 (3,554-3,675 then) on one machine
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
echo "main $(cat .scratch/HEAD_COMMIT); 879bdc5; b6a818a" | tee $OUT/commit.txt
V=$PWD/.scratch/t; P="-m tensorfold.cli bench prefill --config 35B-A3B --no-peer --lengths 2048"
var() { (cd $V/$1 && PYTHONPATH=/tmp/site:$V/$1 timeout $2 python3 -u "${@:3}") 2>&1 | grep -E "tok/s|rror"; }
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
{
echo "== main (t=$(el) s)"; (timeout 150 python3 -u $P 2>&1 | grep -E "tok/s|rror")
echo "== 879bdc5 (t=$(el) s)"; var 879bdc5 90 $P
echo "== b6a818a (t=$(el) s)"; var b6a818a 90 $P
echo "== main again (t=$(el) s)"; (timeout 90 python3 -u $P 2>&1 | grep -E "tok/s|rror")
echo "== profile main (t=$(el) s)"; timeout 150 python3 -u tools/profile_prefill.py --config 35B-A3B --length 2048 --chunks 2048 2>&1 | tail -40
echo "== done (t=$(el) s)"
} 2>&1 | tee $OUT/callM.txt
