cat .scratch/HEAD_COMMIT; nvidia-smi --query-gpu=name --format=csv,noheader; V=$PWD/.scratch/v2
var() { (cd $V/$1 && PYTHONPATH=/tmp/site:$V/$1 timeout $2 python3 "${@:3}") 2>&1 | grep -v -i warn; }
head() { timeout $1 python3 "${@:2}" 2>&1 | grep -v -i warn; }
run() { if [ $1 = head ]; then head "${@:2}"; else var "$@"; fi; }
echo "== contract gemm_affine head"; head 120 -m tensorfold.cli contract --gpu --only gemm_affine | tail -5
for r in 1 16; do for v in head main838; do
echo "== gemm $v rows $r"; run $v 60 -m tensorfold.cli bench gemm --config 2B --rows $r --json $OUT/gemm-$v-$r.json | grep -v copy | tail -8
done; done
for i in 1 2; do for v in head main838 qshuf; do
echo "== decode $v $i"; run $v 100 -m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64 --json $OUT/decode-$v-$i.json | grep -E "^decode round, 1[6 ]|^drafted"
done; done
for v in head main838; do
echo "== prefill $v"; run $v 120 -m tensorfold.cli bench prefill --config 2B --no-peer --lengths 2048 --json $OUT/prefill-$v.json | tail -3
done
echo "== done"
