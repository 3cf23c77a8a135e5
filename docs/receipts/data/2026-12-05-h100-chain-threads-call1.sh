# GPU plan, call 1 of this stop: the scan with a thread per column and chain and the per-row attention staging its keys (head) against main (base,
# 653e380): its contract at GPU shapes, the 2B's decode, kernels and prefill; the 35B-A3B with the fold turned off.
set -u
ROOT=$PWD
exec > >(tee -a $OUT/plan9.txt) 2>&1
date; nvidia-smi --query-gpu=name --format=csv,noheader
run() { local v=$1; shift; (cd $ROOT/.scratch/v/$v && PYTHONPATH=/tmp/site:$ROOT/.scratch/v/$v "$@" 2>&1 | grep -v -i warn); }
echo "== head: the contract at GPU shapes: deltanet_scan, attention_partial"
run head timeout 150 python3 $ROOT/.scratch/contract_exact.py deltanet_scan attention_partial
date
for v in head base; do
  echo "== $v: bench decode 2B"
  run $v timeout 120 python3 -m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64 \
    --cache /tmp/tfcache --json $OUT/decode-2b-$v.json | grep -E "tok/s|round"
  date
done
echo "== head: kernels of the recorded rounds"
run head env TAG=head timeout 100 python3 $ROOT/.scratch/kprof_streams.py 2B 1 16 | head -30
date
for v in base head; do
  echo "== $v: bench prefill 2B 2048,16384"
  run $v timeout 100 python3 -m tensorfold.cli bench prefill --config 2B --no-peer --lengths 2048,16384 --max-seconds 30 \
    --cache /tmp/tfcache --json $OUT/prefill-2b-$v.json | grep -E "prefill|tok/s"
  date
done
for v in nofold base; do
  echo "== $v: bench decode 35B-A3B"
  run $v timeout 150 python3 -m tensorfold.cli bench decode --config 35B-A3B --no-peer --streams 1,16 --tokens 32 \
    --draft-rows 1 --cache /tmp/tfcache --json $OUT/decode-35b-$v.json | grep -E "^decode"
  date
done
