# GPU plan, call 6: the MoE preset, main against the shared expert folded in (with the blocks' expert search).
set -u
ROOT=$PWD
exec > >(tee -a $OUT/plan6.txt) 2>&1
date; nvidia-smi --query-gpu=name --format=csv,noheader
run() { local v=$1; shift; (cd $ROOT/.scratch/v/$v && PYTHONPATH=/tmp/site:$ROOT/.scratch/v/$v "$@" 2>&1 | grep -v -i warn); }
for v in main moe-shared-fold; do
  echo "== $v: bench decode 35B-A3B"
  run $v timeout 230 python3 -m tensorfold.cli bench decode --config 35B-A3B --no-peer --streams 1,16 --tokens 32 \
    --draft-rows 1 --cache /tmp/tfcache --json $OUT/decode-35b-$v.json | grep -E "^decode|round|floor|checkpoint"
  date
done
