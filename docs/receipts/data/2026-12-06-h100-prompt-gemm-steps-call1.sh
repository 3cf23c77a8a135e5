# call 1, on the device, from the repository root, .whl/ and .scratch/ carried; .scratch/v2/<name> are git archives of tensorfold/ (base = 03301f4, words2 = e86ef2b, ahead = 438946a), .scratch/gemm_one.py as in this folder
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; bash .scratch/plan16.sh
cat .scratch/HEAD_COMMIT; V=$PWD/.scratch/v2; nvidia-smi --query-gpu=name --format=csv,noheader
one() { (cd $V/$1 && PYTHONPATH=/tmp/site:$V/$1 timeout 50 python3 $OLDPWD/.scratch/gemm_one.py $2 $3 $4) 2>&1 | grep -v -i warn | tail -1; }
echo "== one head"; timeout 50 python3 .scratch/gemm_one.py 2>&1 | grep -v -i warn
echo "== one base"; one base
echo "== contract prompt head"; timeout 70 python3 -m tensorfold.cli contract --gpu --only prompt 2>&1 | grep -v -i warn | tail -3
echo "== bench gemm head"; timeout 45 python3 -m tensorfold.cli bench gemm --config 2B --rows 2048 --json $OUT/gemm-head.json 2>&1 | grep -v -i warn | tail -10
echo "== prefill head"; timeout 40 python3 -m tensorfold.cli bench prefill --config 2B --no-peer --lengths 2048 --json $OUT/prefill-head.json 2>&1 | grep -v -i warn | tail -3
echo "== one words2"; one words2
echo "== bench gemm ahead"; (cd $V/ahead && PYTHONPATH=/tmp/site:$V/ahead timeout 30 python3 -m tensorfold.cli bench gemm --config 2B --rows 1 --json $OUT/gemm-ahead.json) 2>&1 | grep -v -i warn | tail -9
echo "== bench gemm head 1"; timeout 30 python3 -m tensorfold.cli bench gemm --config 2B --rows 1 --json $OUT/gemm-head-1.json 2>&1 | grep -v -i warn | tail -9
echo "== done"
