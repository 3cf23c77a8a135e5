# One call for every unmeasured variant, in priority order (the output is kept by tee if the call is cut short):
# decode alternating main (v5), attn and keep (v5: the two branches), f4 and r4 (v6: attention variants of main);
# then the contract checks. Each decode's JSON is appended to $OUT/decode.tar as it ends.
cat .scratch/HEAD_COMMIT; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
V5=$PWD/.scratch/v5; V6=$PWD/.scratch/v6; mkdir -p $OUT/j
for d in $V5/main $V5/attn $V5/keep $V6/r4 $V6/f4 $V6/r8; do ln -sfn $PWD/tensorfold/models/tiny-shakespeare $d/tensorfold/models/tiny-shakespeare; done
dir() { case $1 in main|attn|keep) echo $V5/$1;; *) echo $V6/$1;; esac; }
var() { (cd $(dir $1) && PYTHONPATH=/tmp/site:$(dir $1) timeout $2 python3 -u "${@:3}") 2>&1; }
t0=$(date +%s)
{
for i in 1 2; do for v in main attn keep f4 r4; do
echo "== decode $v $i (t=$(( $(date +%s) - t0 )) s)"
var $v 100 -m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64 --json $OUT/j/decode-$v-$i.json | grep -E "^decode round, 1[6 ]|^drafted|rror"
tar -rf $OUT/decode.tar -C $OUT/j decode-$v-$i.json 2>/dev/null
done; done
echo "== contract attn (t=$(( $(date +%s) - t0 )) s)"; var attn 90 -m tensorfold.cli contract --gpu --only lanes | grep -E "^PASS|^FAIL|^SUMMARY|rror"; var attn 60 -m tensorfold.cli contract --gpu --only kv | grep -E "^PASS|^FAIL|^SUMMARY|rror"
echo "== contract keep (t=$(( $(date +%s) - t0 )) s)"; var keep 60 -m tensorfold.cli contract --gpu --only deltanet_apply | grep -E "^PASS|^FAIL|^SUMMARY|rror"
for v in f4 r4; do echo "== contract $v (t=$(( $(date +%s) - t0 )) s)"; var $v 60 -m tensorfold.cli contract --gpu --only attention | grep -E "^PASS|^FAIL|^SUMMARY|rror"; done
echo "== done (t=$(( $(date +%s) - t0 )) s)"
} 2>&1 | tee $OUT/one.txt | tail -c 11000
rm -rf $OUT/j
