# The second call on the same machine: r4's tile check, r8 and r4 beside main, the branches' GPU tests with recordings on.
V5=$PWD/.scratch/v5; V6=$PWD/.scratch/v6; t0=$(date +%s)
dir() { case $1 in main|attn|keep) echo $V5/$1;; *) echo $V6/$1;; esac; }
var() { (cd $(dir $1) && PYTHONPATH=/tmp/site:$(dir $1) timeout $2 python3 -u "${@:3}") 2>&1; }
{
echo "== contract r4 tile"; var r4 100 -m tensorfold.cli contract --gpu --only attention_partial_tile | grep -E "^PASS|^FAIL|^SUMMARY|rror"
for v in r8 main r4; do echo "== decode $v (t=$(( $(date +%s) - t0 )) s)"; var $v 100 -m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64 | grep -E "^decode round, 1[6 ]|^drafted|rror"; done
echo "== pytest attn (t=$(( $(date +%s) - t0 )) s)"; (cd $V5/attn && TENSORFOLD_GRAPHS=1 PYTHONPATH=/tmp/site:$V5/attn timeout 170 python3 -m pytest -q -n 0 -p no:cacheprovider --gpu tests/test_graphs.py tests/test_gpu_lanes.py 2>&1 | tail -3)
echo "== pytest keep (t=$(( $(date +%s) - t0 )) s)"; (cd $V5/keep && TENSORFOLD_GRAPHS=1 PYTHONPATH=/tmp/site:$V5/keep timeout 100 python3 -m pytest -q -n 0 -p no:cacheprovider --gpu tests/test_draft_replay.py 2>&1 | tail -3)
echo "== done (t=$(( $(date +%s) - t0 )) s)"
} 2>&1 | grep -v NumbaPerformanceWarning | tee $OUT/two.txt | tail -c 11000
