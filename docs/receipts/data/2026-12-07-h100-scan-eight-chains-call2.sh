F="NumbaPerformanceWarning|^  warn|grid size|low occupancy"; V=$PWD/.scratch/t
var() { (cd $V/$1 && PYTHONPATH=/tmp/site:$V/$1 timeout $2 python3 -u "${@:3}") 2>&1 | grep -v -E "$F"; }
{
for i in 1 2; do
echo "== prefill scan8 $i"; var scan8 60 -m tensorfold.cli bench prefill --config 2B --no-peer --lengths 2048,16384 | grep -E "^cold|rror|tok/s"
echo "== prefill main $i"; timeout 60 python3 -u -m tensorfold.cli bench prefill --config 2B --no-peer --lengths 2048,16384 2>&1 | grep -E "^cold|rror|tok/s"
done
} 2>&1 | tee $OUT/callG.txt
bash .scratch/callF.sh
