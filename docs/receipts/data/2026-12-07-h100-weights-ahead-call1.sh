# weights before the wait: exactness on the GPU (contract, graphs), then bench decode 2B on five trees
V=$PWD/.scratch/t4; for v in $V/*/; do cp -r tensorfold/models $v/tensorfold/; done
cat $V/commits.txt | tee $OUT/commit.txt; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a $OUT/commit.txt
D2="-m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64 --cache /tmp/tfcache"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
run() { (cd $V/$1 && PYTHONPATH=/tmp/site:$V/$1 timeout $2 python3 -u "${@:3}" 2>&1 | grep -vE "warn\(|Warning|^\s*$" | tail -${TAILN:-30}); }
{
echo "== contract gemm, quantize (ahead) (t=$(el))"; TAILN=12 run ahead 150 -m tensorfold.cli contract --gpu --only gemm; TAILN=4 run ahead 60 -m tensorfold.cli contract --gpu --only quantize
echo "== pytest graphs/overlap (ahead) (t=$(el))"; TAILN=15 run ahead 150 -m pytest --gpu -q -x -p no:cacheprovider tests/test_overlap.py tests/test_graphs.py
for v in main ahead aheadround chunks8 aheadchunks8 main ahead; do echo "== decode 2B $v (t=$(el))"; [ $(el) -lt 520 ] && run $v 100 $D2 --json $OUT/d2-$v-$(el).json; done
echo "== done (t=$(el))"
} 2>&1 | tee $OUT/call4.txt
