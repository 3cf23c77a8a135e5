cat .scratch/HEAD_COMMIT; nvidia-smi --query-gpu=name --format=csv,noheader; V=$PWD/.scratch/v2
var() { (cd $V/$1 && PYTHONPATH=/tmp/site:$V/$1 timeout $2 python3 "${@:3}") 2>&1 | grep -v -i warn; }
for s in "2048 8224 2048" "2048 2048 2048" "2048 5120 2048" "2048 2048 6144"; do
echo "== one head $s"; timeout 40 python3 .scratch/gemm_one.py $s 2>&1 | grep -v -i warn | tail -1
echo "== one main6c $s"; var main6c 40 $PWD/.scratch/gemm_one.py $s | tail -1
done
echo "== profile head"; timeout 100 python3 tools/profile_prefill.py --config 2B --length 2048 --chunks 2048 --json $OUT/profile-head.json 2>&1 | grep -v -i warn | tail -22
echo "== profile main6c"; var main6c 100 $PWD/tools/profile_prefill.py --config 2B --length 2048 --chunks 2048 --json $OUT/profile-main6c.json | tail -22
echo "== done"
