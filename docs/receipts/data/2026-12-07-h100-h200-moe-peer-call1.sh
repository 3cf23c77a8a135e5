echo "main $(cat .scratch/HEAD_COMMIT); pre = 976ba23 + scales loaded with the codes (old router)" | tee $OUT/commit.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a $OUT/commit.txt
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
{
echo "== route new (t=$(el))"; timeout 60 python3 -u .scratch/route_bench.py new 2>&1 | grep route
echo "== route old (t=$(el))"; (cd .scratch/t/pre && PYTHONPATH=/tmp/site:$PWD timeout 60 python3 -u route_bench.py old 2>&1 | grep route)
echo "== sweep main (t=$(el))"
timeout 260 python3 -u .scratch/experts_sweep.py main 2>&1 | grep -v "warn(" | grep -v Warning
echo "== sweep pre (t=$(el))"
(cd .scratch/t/pre && PYTHONPATH=/tmp/site:$PWD timeout $(( 470 - $(el) )) python3 -u experts_sweep.py pre round2,round4,whole2,whole4 2>&1 | grep -v "warn(" | grep -v Warning)
echo "== done (t=$(el))"
} 2>&1 | tee $OUT/call1.txt
