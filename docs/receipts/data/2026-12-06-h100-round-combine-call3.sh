# the whole suite under pytest --gpu with recordings on, at the final code; then the round figures once more
set -u
date; cat .scratch/HEAD_COMMIT; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
TENSORFOLD_GRAPHS=1 timeout 520 python3 -m pytest --gpu -n 15 -p no:cacheprovider -q -rfE \
  --tb=short --timeout 300 --durations=20 2>&1 | grep -v -i "warn" > $OUT/pytest-gpu.log
echo "pytest rc ${PIPESTATUS[0]}"; tail -60 $OUT/pytest-gpu.log; date
