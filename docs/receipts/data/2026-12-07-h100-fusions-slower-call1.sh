# contracts (main's new kernels; staged3's GEMMs and experts, never run on a GPU), then the fast A/B figures
V=$PWD/.scratch/t2; for v in $V/*/; do cp -r tensorfold/models $v/tensorfold/; done
cat $V/commits.txt | tee $OUT/commit.txt; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a $OUT/commit.txt
E="-m tensorfold.cli bench experts --config 35B-A3B --rows 1,16 --repeats 50"
G="-m tensorfold.cli bench gemm --config 35B-A3B --rows 1,16"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
run() { (cd $V/$1 && PYTHONPATH=/tmp/site:$V/$1 timeout $2 python3 -u "${@:3}" 2>&1 | grep -vE "warn\(|^\s*$" | tail -30); }
{
echo "== contract main (t=$(el))"; run main 150 -m tensorfold.cli contract --gpu --only "with digits"
run main 150 -m tensorfold.cli contract --gpu --only moe; run main 40 -m tensorfold.cli contract --gpu --only ptx
run main 60 -m tensorfold.cli contract --gpu --only conv_scan
echo "== contract staged3 (t=$(el))"; run staged3 120 -m tensorfold.cli contract --gpu --only gemm_affine4
run staged3 100 -m tensorfold.cli contract --gpu --only moe_routed
for v in main staged1 staged3 main staged3; do echo "== experts $v (t=$(el))"; [ $(el) -lt 470 ] && run $v 45 $E --json $OUT/experts-$v-$(el).json; done
for v in main staged3 chunks8; do echo "== gemm $v (t=$(el))"; [ $(el) -lt 540 ] && run $v 30 $G --json $OUT/gemm-$v-$(el).json; done
echo "== done (t=$(el))"
} 2>&1 | tee $OUT/call1.txt
