# GPU plan, call 5: prefill of main and scan chains alternating, the scan's contract at GPU shapes.
set -u
ROOT=$PWD
exec > >(tee -a $OUT/plan5.txt) 2>&1
date; nvidia-smi --query-gpu=name --format=csv,noheader
run() { local v=$1; shift; (cd $ROOT/.scratch/v/$v && PYTHONPATH=/tmp/site:$ROOT/.scratch/v/$v "$@" 2>&1 | grep -v -i warn); }
for v in scan-chains main scan-chains main; do
  echo "== $v: bench prefill 2B 2048, 16384"
  run $v timeout 100 python3 -m tensorfold.cli bench prefill --config 2B --no-peer --lengths 2048,16384 \
    --max-seconds 30 --cache /tmp/tfcache --json $OUT/prefill-2b-$v-$(date +%H%M%S).json | grep -E "^cold prefill"
  date
done
echo "== scan-chains: contract --gpu --only deltanet"
run scan-chains timeout 200 python3 -m tensorfold.cli contract --gpu --only deltanet | tail -4
date
