cat .scratch/HEAD_COMMIT; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; V=$PWD/.scratch/v4
ln -sfn $PWD/tensorfold/models/tiny-shakespeare $V/lanes/tensorfold/models/tiny-shakespeare
var() { (cd $V/$1 && PYTHONPATH=/tmp/site:$V/$1 timeout $2 python3 "${@:3}") 2>&1; }
{
echo "== contract lanes (branch)"; var lanes 150 -m tensorfold.cli contract --gpu --only lanes | grep -E "^PASS|^FAIL|^SUMMARY|rror|lanes"
for i in 1 2; do
for v in main lanes; do
echo "== decode $v $i"; var $v 120 -m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64 --json $OUT/decode-$v-$i.json | grep -E "^decode round, 1[6 ]|^drafted|rror"
done; done
echo "== pytest graphs+lanes (branch, recordings on)"; (cd $V/lanes && TENSORFOLD_GRAPHS=1 PYTHONPATH=/tmp/site:$V/lanes timeout 200 python3 -m pytest -q -n 0 -p no:cacheprovider --gpu tests/test_graphs.py tests/test_gpu_lanes.py 2>&1 | tail -6)
echo "== prof lanes"; var lanes 150 $PWD/.scratch/prof.py 2B | grep -v -i warn; cp $OUT/prof-rounds.json $OUT/prof-lanes.json
echo "== done"
} 2>&1 | tee $OUT/call1.txt | tail -c 11000
