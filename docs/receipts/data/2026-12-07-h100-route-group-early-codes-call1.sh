# main a64f9e7; early128 = main's head (the router and grouping in one launch) + a grouped round block's chunk of codes
# loaded first, capped at 128 registers; regs = a64f9e7 + the grouped round kernel at 96 registers; early_all =
# early128 + the dense round kernel's one-row tiles loading their chunk first; early_wide = early_all + the chunk-of-K
# GEMM kernel's one-row tiles too
cat .scratch/commits.txt | tee $OUT/commit.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a $OUT/commit.txt
V=$PWD/.scratch/t; for v in $V/*; do cp -r tensorfold/models $v/tensorfold/; done
E="-m tensorfold.cli bench experts --config 35B-A3B --rows 1,16 --repeats 50"
D="-m tensorfold.cli bench decode --config 35B-A3B --no-peer --streams 1,16 --tokens 64"
G="-m tensorfold.cli bench gemm --config 35B-A3B --rows 1"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
run() { (cd $V/$1 && PYTHONPATH=/tmp/site:$V/$1 timeout $2 python3 -u "${@:3}" 2>&1 | grep -E "PASS|FAIL|rows|copy|round|tok/s|rror|us|SUMMARY" | grep -v "warn("); }
{
echo "== contract early_all moe_route (t=$(el))"; run early_all 100 -m tensorfold.cli contract --gpu --only moe_route
for v in main early128 regs main early128; do echo "== experts $v (t=$(el))"; run $v 40 $E --json $OUT/experts-$v-$(el).json; done
for v in main early_all; do echo "== decode 35B $v (t=$(el))"; [ $(el) -lt 330 ] && run $v 105 $D --json $OUT/d35-$v.json; done
for v in main early_all early_wide; do echo "== gemm $v (t=$(el))"; [ $(el) -lt 470 ] && run $v 30 $G --json $OUT/gemm-$v.json; done
echo "== contract early_all gemm_affine4 (t=$(el))"; [ $(el) -lt 480 ] && run early_all $(( 545 - $(el) )) -m tensorfold.cli contract --gpu --only gemm_affine4
echo "== done (t=$(el))"
} 2>&1 | tee $OUT/call1.txt
