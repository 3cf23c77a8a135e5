# GPU plan, call 7: the MoE fold's contracts and MoE tests on the GPU; the fold alone (575d14f) on 35B-A3B.
set -u
ROOT=$PWD
exec > >(tee -a $OUT/plan7.txt) 2>&1
date; nvidia-smi --query-gpu=name --format=csv,noheader
run() { local v=$1; shift; (cd $ROOT/.scratch/v/$v && PYTHONPATH=/tmp/site:$ROOT/.scratch/v/$v "$@" 2>&1 | grep -v -i warn); }
echo "== moe-shared-fold: contract --gpu --only moe"
run moe-shared-fold timeout 200 python3 -m tensorfold.cli contract --gpu --only moe | tail -7
date
echo "== moe-shared-fold: pytest --gpu, the MoE tests"
run moe-shared-fold timeout 200 python3 -m pytest -q -x -p no:cacheprovider -n 8 --gpu tests/test_moe_sim.py \
  tests/test_moe_exactness.py tests/test_experts_sim.py tests/test_moe_checkpoints.py | tail -6
date
echo "== fold-only (575d14f): bench decode 35B-A3B"
run fold-only timeout 150 python3 -m tensorfold.cli bench decode --config 35B-A3B --no-peer --streams 1,16 --tokens 32 \
  --draft-rows 1 --cache /tmp/tfcache --json $OUT/decode-35b-fold-only.json | grep -E "^decode"
date
