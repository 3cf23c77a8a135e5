echo "main $(cat .scratch/HEAD_COMMIT); pre = 976ba23 + scales loaded with the codes (old router)" | tee $OUT/commit.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a $OUT/commit.txt
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
G="-m tensorfold.cli bench gemm --rows 1,16 --repeats 40"
{
for rep in 1 2; do
echo "== sweep main (t=$(el))"; timeout 100 python3 -u .scratch/experts_sweep.py main$rep round2,whole2 2>&1 | grep rows
echo "== sweep pre (t=$(el))"; (cd .scratch/t/pre && PYTHONPATH=/tmp/site:$PWD timeout 100 python3 -u experts_sweep.py pre$rep round2,whole2 2>&1 | grep rows)
done
for c in 35B-A3B 2B; do
echo "== gemm $c main (t=$(el))"; timeout 150 python3 -u $G --config $c --json $OUT/gemm-$c-main.json 2>&1 | grep rows
echo "== gemm $c pre (t=$(el))"; (cd .scratch/t/pre && PYTHONPATH=/tmp/site:$PWD timeout 150 python3 -u $G --config $c --json $OUT/gemm-$c-pre.json 2>&1 | grep rows)
done
echo "== done (t=$(el))"
} 2>&1 | tee $OUT/call2.txt
