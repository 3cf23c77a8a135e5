cat .scratch/HEAD_COMMIT; V=$PWD/.scratch/v3; nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
F="NumbaPerformanceWarning|^  warn|grid size|low occupancy"
tf() { if [ $1 = head ]; then D=$PWD; else D=$V/$1; fi; shift; (cd $D && PYTHONPATH=/tmp/site:$D python3 -m tensorfold.cli "$@") 2>&1 | grep -v -E "$F"; }
SECS="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
{ for shape in "1 2048 2048 plain" "1 12288 2048 gated"; do echo "== ncu main $shape"; (cd $V/noahead && PYTHONPATH=/tmp/site:$V/noahead timeout 100 ncu --clock-control none --profile-from-start off $SECS --print-details all python3 $OLDPWD/.scratch/ncu_one.py $shape) 2>&1 | grep -v -E "$F"; done; } > $OUT/ncu-one-row.txt 2>&1
grep -E "gemm|combine|quantize|Duration|DRAM Throughput|Stall Long|Stall Wait|Warp Cycles Per Issued|Registers Per|Achieved Occ|Eligible Warps" $OUT/ncu-one-row.txt | cut -c1-110 | head -60
{ for v in noahead c256 c128; do echo "== bench gemm cold $v"; timeout 100 bash -c "$(declare -f tf); F='$F'; V=$V; tf $v bench gemm --config 2B --rows 1,16 --json $OUT/gemm-cold-$v.json" | tail -14; done; } 2>&1 > $OUT/gemm-chunks.txt; cat $OUT/gemm-chunks.txt | cut -c1-20,37-120
{ n=0; for v in noahead c256 c128 noahead; do n=$((n+1)); echo "== decode $v"; timeout 100 bash -c "$(declare -f tf); F='$F'; V=$V; tf $v bench decode --config 2B --no-peer --streams 1,16 --tokens 64 --cache /tmp/tfcache --json $OUT/decode-$v-$n.json" | grep -E "^#.*(decode x|drafted round)"; done; } 2>&1 | tee $OUT/decode.txt
(cd $OUT && tar czf json.tgz *.json && rm -f *.json); echo "== done"
