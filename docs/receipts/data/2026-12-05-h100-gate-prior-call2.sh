# Next stop's first device call (prepare: rm -rf .scratch/v/*; mkdir -p .scratch/v/main; git archive c137390 tensorfold
# | tar -x -C .scratch/v/main; git log --oneline -1 > .scratch/HEAD_COMMIT). Carry .whl (now with sphinx) and .scratch.
# 1. the gate's watching rule (HEAD) against c137390: bench drafter, greedy and T = 0.8 (auto must draft greedy chains
#    and stay no slower than undrafted at T = 0.8); 2. the docs build under --gpu (sphinx carried); 3. where a mixed
#    round's time goes: tools/profile_prompt_rounds.py at 128-row chunks, with and without the garbage collector;
# 4. the MoE grouping a block an expert (a6572c3): its contract at GPU shapes (2,048 rows included), and bench prefill
#    --config 35B-A3B --lengths 2048 against c137390; 5. the changed test files under --gpu with recordings on.
set -u
ROOT=$PWD
START=$(date +%s)
left() { echo $(( 560 - ($(date +%s) - START) )); }
exec > >(tee -a $OUT/plan13b.txt) 2>&1
date; cat .scratch/HEAD_COMMIT
for v in head main; do
  echo "== $v: bench prefill 35B-A3B 2048"
  if [ $v = head ]; then d=$ROOT; else d=$ROOT/.scratch/v/main; fi
  (cd $d && PYTHONPATH=/tmp/site:$d timeout $(left) python3 -m tensorfold.cli bench prefill --config 35B-A3B --no-peer \
    --lengths 2048 --cache /tmp/tfcache --json $OUT/prefill-35b-$v.json 2>&1 | grep -v -i warn | tail -3); date
done
echo "== gate, drafter and prompt-cache tests --gpu, recordings on"
TENSORFOLD_GRAPHS=1 timeout $(left) python3 -m pytest --gpu -n 14 --dist load -p no:cacheprovider -q -rfE \
  --tb=short tests/test_draft_gate.py tests/test_block_drafter.py tests/test_draft_replay.py tests/test_server.py \
  2>&1 | grep -v -i warn | tail -25; date
