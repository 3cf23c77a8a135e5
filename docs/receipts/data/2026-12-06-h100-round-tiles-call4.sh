cat .scratch/HEAD_COMMIT; nvidia-smi --query-gpu=name --format=csv,noheader; V=$PWD/.scratch/v2
var() { (cd $V/$1 && PYTHONPATH=/tmp/site:$V/$1 timeout $2 python3 "${@:3}") 2>&1 | grep -v -i warn; }
N="ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active,launch__occupancy_limit_shared_mem,launch__occupancy_limit_registers -k regex:gemm|combine"
echo "== ncu head"; timeout 60 $N python3 .scratch/gemm_one.py 2048 12288 2048 --once 2>&1 | grep -E "gemm|combine|duration|bytes|hit_rate|warps_active|occupancy" | grep -v "^==" | cut -c1-110
echo "== ncu main6c"; (cd $V/main6c && PYTHONPATH=/tmp/site:$V/main6c timeout 60 $N python3 $OLDPWD/.scratch/gemm_one.py 2048 12288 2048 --once) 2>&1 | grep -E "gemm|combine|duration|bytes|hit_rate|warps_active|occupancy" | grep -v "^==" | cut -c1-110
echo "== decode scan"; var scan 150 -m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64 --json $OUT/decode-scan.json | tail -8
echo "== decode main6c"; var main6c 150 -m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64 --json $OUT/decode-main6c.json | tail -8
echo "== done"
