# The gate read from q_proj's output as it is (d393c74) against d19801e: prefill and chunk rounds of the 2B, the
# prompt rounds' profile at 128 and 2,048 rows, and the merge's contract at GPU shapes.
set -u
ROOT=$PWD
START=$(date +%s)
left() { echo $(( 560 - ($(date +%s) - START) )); }
exec > >(tee -a $OUT/plan14.txt) 2>&1
date; cat .scratch/HEAD_COMMIT; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== merge contract"
timeout 120 python3 .scratch/contract_exact.py attention_merge attention 2>&1 | grep -v -i warn | tail -4; date
for v in head base; do
  if [ $v = head ]; then d=$ROOT; else d=$ROOT/.scratch/v/base; fi
  echo "== $v: bench prefill 2B"
  (cd $d && PYTHONPATH=/tmp/site:$d timeout 150 python3 -m tensorfold.cli bench prefill --config 2B --no-peer \
    --lengths 512,2048,16384 --cache /tmp/tfcache --json $OUT/prefill-2b-$v.json 2>&1 | grep -v -i warn | tail -5); date
  echo "== $v: bench chunk 2B"
  (cd $d && PYTHONPATH=/tmp/site:$d timeout 100 python3 -m tensorfold.cli bench chunk --config 2B --chunks 128,512,2048 \
    --cache /tmp/tfcache --json $OUT/chunk-2b-$v.json 2>&1 | grep -v -i warn | tail -5); date
done
echo "== profile 128 rows beside 4 streams"
timeout $(left) python3 tools/profile_prompt_rounds.py --config 2B --cache /tmp/tfcache --chunk 128 --top 30 \
  > $OUT/profile-128.txt 2>&1; grep -v -i warn $OUT/profile-128.txt | head -4; date
echo "== profile 2048 rows alone"
timeout $(left) python3 tools/profile_prompt_rounds.py --config 2B --cache /tmp/tfcache --chunk 2048 --streams 0 \
  --top 30 > $OUT/profile-2048.txt 2>&1; grep -v -i warn $OUT/profile-2048.txt | head -4; date
