# weights before the wait: the 35B-A3B (main, ahead), then the 2B again alternating
V=$PWD/.scratch/t4; for v in $V/main $V/ahead; do cp -r tensorfold/models $v/tensorfold/; done
cat $V/commits.txt | tee $OUT/commit.txt; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a $OUT/commit.txt
D35="-m tensorfold.cli bench decode --config 35B-A3B --no-peer --streams 1,16 --tokens 32 --draft-rows 1 --cache /tmp/tfcache"
D2="-m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64 --cache /tmp/tfcache"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
run() { (cd $V/$1 && PYTHONPATH=/tmp/site:$V/$1 timeout $2 python3 -u "${@:3}" 2>&1 | grep -vE "warn\(|Warning|^\s*$" | tail -${TAILN:-30}); }
{
for v in main ahead; do echo "== decode 35B $v (t=$(el))"; run $v 220 $D35 --json $OUT/d35-$v-$(el).json; done
for v in ahead main ahead main; do echo "== decode 2B $v (t=$(el))"; [ $(el) -lt 500 ] && run $v 90 $D2 --json $OUT/d2-$v-$(el).json; done
echo "== done (t=$(el))"
} 2>&1 | tee $OUT/call5.txt
