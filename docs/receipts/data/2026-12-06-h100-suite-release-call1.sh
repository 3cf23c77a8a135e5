# call 1: the whole suite under --gpu on main d239a8d, 15 workers, the device's memory sampled every 10 s
# command: <the device's wheel install line>; SUITE_S=560 bash suite.sh
# the whole suite under --gpu, the device's memory sampled every 10 s
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt
git log --oneline -1 > $OUT/commit.txt
(while true; do nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader >> $OUT/mem.csv; sleep 10; done) &
start=$(date +%s)
timeout ${SUITE_S:-540} python3 -m pytest --gpu -n ${WORKERS:-15} -v -rfE -p no:cacheprovider --junitxml=$OUT/junit.xml $TESTS > $OUT/suite.log 2>&1
echo "rc=$? wall=$(( $(date +%s) - start ))s" >> $OUT/suite.log
grep -E "FAILED|ERROR|passed|failed" $OUT/suite.log | tail -60
sort -t, -k2 -n $OUT/mem.csv | tail -3
