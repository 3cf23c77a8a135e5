# the whole-K prompt GEMM (main) beside before = 9a8dd29: the contract, prefill alternating (35B-A3B, 2B), profile
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
echo "main $(cat .scratch/HEAD_COMMIT); before = 9a8dd29" | tee $OUT/commit.txt
V=$PWD/.scratch/t; P="-m tensorfold.cli bench prefill --no-peer"
D="-m tensorfold.cli bench decode --config 35B-A3B --no-peer --streams 1,16 --tokens 64"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
{
for only in gemm moe_routed; do
echo "== contract $only (t=$(el))"; timeout 120 python3 -m tensorfold.cli contract --gpu --only $only 2>&1 | grep -E "^PASS|^FAIL|^SUMMARY|rror" | grep -v "warn(" | cut -c1-400
done
for run in 1 2; do
echo "== 35B main $run (t=$(el))"; timeout 150 python3 -u $P --config 35B-A3B --lengths 2048 --json $OUT/p35-main-$run.json 2>&1 | grep -E "tok/s|rror" | grep -v "warn("
echo "== 35B before $run (t=$(el))"; (cd $V/m9a && PYTHONPATH=/tmp/site:$V/m9a timeout 100 python3 -u $P --config 35B-A3B --lengths 2048 --json $OUT/p35-before-$run.json 2>&1 | grep -E "tok/s|rror" | grep -v "warn(")
done
echo "== 2B main (t=$(el))"; timeout 80 python3 -u $P --config 2B --lengths 2048,16384 --json $OUT/p2b-main.json 2>&1 | grep -E "tok/s|rror" | grep -v "warn("
echo "== 2B before (t=$(el))"; (cd $V/m9a && PYTHONPATH=/tmp/site:$V/m9a timeout 80 python3 -u $P --config 2B --lengths 2048,16384 --json $OUT/p2b-before.json 2>&1 | grep -E "tok/s|rror" | grep -v "warn(")
[ $(el) -lt 350 ] && { echo "== profile 35B main (t=$(el))"; timeout $(( 425 - $(el) )) python3 -u tools/profile_prefill.py --config 35B-A3B --length 2048 --chunks 2048 --json $OUT/profile-35b.json 2>&1 | grep -v Warn | grep -v "warn(" | tail -30; }
echo "== done (t=$(el))"
} 2>&1 | tee $OUT/callT.txt
