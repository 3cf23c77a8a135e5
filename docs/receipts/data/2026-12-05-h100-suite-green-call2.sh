# Call B: the whole suite under pytest --gpu with recordings on; tracebacks kept, a per-test limit.
set -u
exec > >(tee -a $OUT/plan12b.txt) 2>&1
date; cat .scratch/HEAD_COMMIT; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
TENSORFOLD_GRAPHS=1 timeout 570 python3 -m pytest --gpu -n 15 -p no:cacheprovider -q -rfE \
  --tb=short --timeout 300 --durations=40 --junitxml=$OUT/junit-gpu.xml 2>&1 | grep -v -i "warn" > $OUT/pytest-gpu.log
echo "pytest rc ${PIPESTATUS[0]}"; tail -120 $OUT/pytest-gpu.log; date
