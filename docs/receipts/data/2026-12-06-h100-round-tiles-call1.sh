git rev-parse --short HEAD; nvidia-smi --query-gpu=name --format=csv,noheader
export NCU="ncu --clock-control none"
echo "== checkpoint + prefill profile"; timeout 200 python3 tools/profile_prefill.py --config 2B --length 2048 --chunks 2048 --json $OUT/prefill-profile.json 2>&1 | grep -v -i warn | tail -40
echo "== rounds 2B plain"; timeout 60 python3 .scratch/rounds_2b.py 40 2>&1 | grep -v -i warn | tail -2
echo "== rounds 2B ncu"; timeout 150 $NCU --metrics gpu__time_duration.sum --csv --launch-skip 0 --launch-count 100000 -k regex:. python3 .scratch/rounds_2b.py 6 > $OUT/rounds-ncu.csv 2> $OUT/rounds-ncu.err; tail -2 $OUT/rounds-ncu.err; wc -l $OUT/rounds-ncu.csv
SECS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SourceCounters"
echo "== ncu prompt gemm"; timeout 100 $NCU $SECS -k regex:gemm -c 1 python3 .scratch/gemm_one.py 2048 12288 2048 --once > $OUT/ncu-prompt.txt 2>&1; grep -c . $OUT/ncu-prompt.txt
echo "== ncu round gemm 1 row"; timeout 80 $NCU $SECS -k regex:gemm -c 1 python3 .scratch/gemm_one.py 1 12288 2048 --once > $OUT/ncu-round1.txt 2>&1; grep -c . $OUT/ncu-round1.txt
echo "== ncu round quantize+combine 1 row"; timeout 80 $NCU --section SpeedOfLight --section LaunchStats --section WarpStateStats -k regex:"quantize|combine" -c 2 python3 .scratch/gemm_one.py 1 12288 2048 --once > $OUT/ncu-round1-qc.txt 2>&1; grep -c . $OUT/ncu-round1-qc.txt
echo "== done"
