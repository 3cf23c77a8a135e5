# the whole suite under --gpu with overlapped launches on (TENSORFOLD_OVERLAP=1), the device's memory every 10 s
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
echo "main $(cat .scratch/HEAD_COMMIT)" > $OUT/commit.txt; python3 -c "import sphinx, openai, llguidance; print('sphinx', sphinx.__version__, 'openai', openai.__version__)" >> $OUT/commit.txt 2>&1
(while true; do nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader >> $OUT/mem.csv; sleep 10; done) &
start=$(date +%s)
TENSORFOLD_OVERLAP=${OVERLAP:-1} timeout ${SUITE_S:-545} python3 -m pytest --gpu -n ${WORKERS:-15} -v -rfE -p no:cacheprovider --junitxml=$OUT/junit.xml $TESTS > $OUT/suite.log 2>&1
echo "rc=$? wall=$(( $(date +%s) - start ))s" >> $OUT/suite.log
cat $OUT/commit.txt; grep -E "FAILED|ERROR|passed|failed|rc=" $OUT/suite.log | tail -60
sort -t, -k2 -n $OUT/mem.csv | tail -2
