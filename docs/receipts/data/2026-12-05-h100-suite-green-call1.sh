# Call A: the bound on one launch for every stream's conv, scan and attention (noperstream: wrong numbers, the time
# only), two unmeasured experiments, all against head in this call; bench chunk on the 2B (the default --chunk); the
# 35B-A3B's prefill; the embedded model's drafter table as time allows.
set -u
ROOT=$PWD
START=$(date +%s)
exec > >(tee -a $OUT/plan12a.txt) 2>&1
date; cat .scratch/HEAD_COMMIT; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
left() { echo $(( 585 - ($(date +%s) - START) )); }
run() { local v=$1; shift; (cd $ROOT/.scratch/v/$v && PYTHONPATH=/tmp/site:$ROOT/.scratch/v/$v "$@" 2>&1 | grep -v -i warn); }
for v in head noperstream attention-loads gemm-padding-loads; do
  echo "== $v: bench decode 2B"
  run $v timeout $(left) python3 -m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64 \
    --draft-rows 1 --cache /tmp/tfcache --json $OUT/decode-2b-$v.json | grep -E "^#   "; date
done
echo "== bench chunk 2B"
timeout $(left) python3 -m tensorfold.cli bench chunk --config 2B --streams 4 --prompt 4096 \
  --chunks 128,256,512,2048 --cache /tmp/tfcache --json $OUT/chunk-2b.json 2>&1 | grep -v -i warn | tail -8; date
echo "== bench prefill 35B-A3B"
timeout $(left) python3 -m tensorfold.cli bench prefill --config 35B-A3B --no-peer --lengths 2048 \
  --cache /tmp/tfcache --json $OUT/prefill-35b.json 2>&1 | grep -v -i warn | tail -4; date
echo "== bench drafter (embedded)"
timeout $(left) python3 -m tensorfold.cli bench drafter --backend cuda --tokens 128 \
  --json $OUT/drafter.json 2>&1 | grep -v -i warn | tail -12; date
