# bench prefill (each length twice, the faster kept): the 35B-A3B at 2,048 tokens at head and with the MoE grouping
# before a6572c3 (pairs: every thread counts every pair), then the 2B at 512, 2,048 and 16,384 at head.
set -u
ROOT=$PWD
START=$(date +%s)
left() { echo $(( 270 - ($(date +%s) - START) )); }
exec > >(tee -a $OUT/plan16.txt) 2>&1
date; cat .scratch/HEAD_COMMIT; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for v in head pairs; do
  if [ $v = head ]; then d=$ROOT; else d=$ROOT/.scratch/v/$v; fi
  echo "== $v: bench prefill 35B-A3B 2048"
  (cd $d && PYTHONPATH=/tmp/site:$d timeout $(left) python3 -m tensorfold.cli bench prefill --config 35B-A3B --no-peer \
    --lengths 2048 --cache /tmp/tfcache --json $OUT/prefill-35b-$v.json 2>&1 | grep -v -i warn | grep "prefill\|tok/s"); date
done
echo "== head: bench prefill 2B"
timeout $(left) python3 -m tensorfold.cli bench prefill --config 2B --no-peer --lengths 512,2048,16384 --cache /tmp/tfcache \
  --json $OUT/prefill-2b-head.json 2>&1 | grep -v -i warn | grep "prefill\|tok/s"; date
