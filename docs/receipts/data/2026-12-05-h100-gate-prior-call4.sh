# 878bbab: bench drafter at head (prior-seeded stream means) and with the drafter always shown the kept rows (watch);
# tools/profile_prefill.py per op for a 2,048-row chunk of the 2B, and of the 35B-A3B at head and at c137390 (group).
set -u
ROOT=$PWD
START=$(date +%s)
left() { echo $(( 560 - ($(date +%s) - START) )); }
exec > >(tee -a $OUT/plan15.txt) 2>&1
date; cat .scratch/HEAD_COMMIT; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for v in head watch; do
  if [ $v = head ]; then d=$ROOT; else d=$ROOT/.scratch/v/$v; fi
  echo "== $v: bench drafter"
  (cd $d && PYTHONPATH=/tmp/site:$d timeout 120 python3 -m tensorfold.cli bench drafter --backend cuda --tokens 128 \
    --json $OUT/drafter-$v.json 2>&1 | grep -v -i warn | tail -8); date
done
echo "== head: profile_prefill 2B"
timeout 150 python3 tools/profile_prefill.py --config 2B --length 2048 --chunks 2048 --cache /tmp/tfcache \
  --json $OUT/ops-2b.json 2>&1 | grep -v -i warn | head -40; date
for v in head group; do
  if [ $v = head ]; then d=$ROOT; else d=$ROOT/.scratch/v/$v; fi
  echo "== $v: profile_prefill 35B-A3B"
  (cd $d && PYTHONPATH=/tmp/site:$d timeout $(left) python3 $ROOT/tools/profile_prefill.py --config 35B-A3B --length 2048 \
    --chunks 2048 --cache /tmp/tfcache --json $OUT/ops-35b-$v.json 2>&1 | grep -v -i warn | head -30); date
done
