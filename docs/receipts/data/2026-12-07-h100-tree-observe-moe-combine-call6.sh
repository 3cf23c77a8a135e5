# a tree round's host maps and walk as lists (main) beside before = 897e248, alternating
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
echo "main $(cat .scratch/HEAD_COMMIT); before = 897e248" | tee $OUT/commit.txt
V=$PWD/.scratch/t; R="-m tensorfold.cli bench drafter --backend cuda --tokens 128"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
{
for run in 1 2; do
echo "== drafter main $run (t=$(el))"; timeout 70 python3 -u $R --json $OUT/drafter-main-$run.json 2>&1 | grep -E "decode|rror"
echo "== drafter before $run (t=$(el))"; (cd $V/nostage && PYTHONPATH=/tmp/site:$V/nostage timeout 70 python3 -u $R --json $OUT/drafter-before-$run.json 2>&1 | grep -E "decode|rror")
done
echo "== done (t=$(el))"
} 2>&1 | tee $OUT/callR.txt
