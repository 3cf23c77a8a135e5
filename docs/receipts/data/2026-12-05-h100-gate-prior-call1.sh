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
exec > >(tee -a $OUT/plan13a.txt) 2>&1
date; cat .scratch/HEAD_COMMIT; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for v in head main; do
  echo "== $v: bench drafter"
  if [ $v = head ]; then d=$ROOT; else d=$ROOT/.scratch/v/main; fi
  (cd $d && PYTHONPATH=/tmp/site:$d timeout 120 python3 -m tensorfold.cli bench drafter --backend cuda --tokens 128 \
    --json $OUT/drafter-$v.json 2>&1 | grep -v -i warn | tail -9); date
done
echo "== test_docs --gpu"
timeout 120 python3 -m pytest --gpu -p no:cacheprovider -q -n 0 tests/test_docs.py 2>&1 | tail -3; date
for gc in "" "--no-gc"; do
  echo "== profile_prompt_rounds $gc"
  timeout $(left) python3 tools/profile_prompt_rounds.py --config 2B --cache /tmp/tfcache --chunk 128 --top 25 $gc \
    2>&1 | grep -v -i warn | head -90; date
done
echo "== the grouping's contract at GPU shapes"
timeout 200 python3 .scratch/contract_exact.py moe_expert_groups moe_routed_experts4 2>&1 | grep -v -i warn | tail -8; date
