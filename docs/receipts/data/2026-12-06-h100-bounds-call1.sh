cat .scratch/HEAD_COMMIT; V=$PWD/.scratch/v3; nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader; which ncu; ncu --version | tail -1
F="NumbaPerformanceWarning|^  warn|grid size|low occupancy"
echo "== one head"; timeout 90 python3 .scratch/gemm_one.py 2>&1 | grep -v -E "$F" | tail -1
echo "== one nocombine"; (cd $V/nocombine && PYTHONPATH=/tmp/site:$V/nocombine timeout 90 python3 $OLDPWD/.scratch/gemm_one.py) 2>&1 | grep -v -E "$F" | tail -1
echo "== one head 16 rows"; timeout 90 python3 .scratch/gemm_one.py 16 12288 2048 2>&1 | grep -v -E "$F" | tail -1
SECS="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section InstructionStats"
echo "== ncu"; timeout 200 ncu --clock-control none --profile-from-start off $SECS --print-details all -k regex:gemm python3 .scratch/ncu_gemm.py > $OUT/ncu-gemm.txt 2>&1; echo rc $?
grep -E "round_gemm|gemm_[0-9A-Za-z]*\(|Stall|Warp Cycles|Issued|Eligible|Occupancy|Registers|Throughput|Pipe|Duration|Executed Ipc|Busy|Hit Rate|L2|DRAM" $OUT/ncu-gemm.txt | grep -v -E "$F" | head -150
echo "== prof"; timeout 330 python3 .scratch/prof.py embedded 2B > $OUT/prof.txt 2>&1; echo rc $?; grep -v -E "$F" $OUT/prof.txt | tail -130
echo "== done"
