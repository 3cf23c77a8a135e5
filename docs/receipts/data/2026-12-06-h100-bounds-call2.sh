cat .scratch/HEAD_COMMIT; V=$PWD/.scratch/v3; nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
F="NumbaPerformanceWarning|^  warn|grid size|low occupancy"
one() { if [ $1 = head ]; then D=$PWD; else D=$V/$1; fi; (cd $D && PYTHONPATH=/tmp/site:$D timeout 90 python3 /root/repo_gemm_one.py $2 $3 $4) 2>&1 | grep -v -E "$F" | tail -1; }
cp .scratch/gemm_one.py /root/repo_gemm_one.py
{ for v in head nocombine r4t2 r2t4 r3t4 head; do echo "$v 2048 12288 2048: $(one $v)"; done
for shape in "2048 2048 6144" "2048 8224 2048"; do
  for v in head r4t2 r2t4; do echo "$v $shape: $(one $v $shape)"; done
done; } | tee $OUT/gemm-variants.txt
pf() { if [ $1 = head ]; then D=$PWD; else D=$V/$1; fi; (cd $D && PYTHONPATH=/tmp/site:$D timeout 150 python3 -m tensorfold.cli bench prefill --config 2B --no-peer --lengths $2 --cache /tmp/tfcache --json $OUT/prefill-$1.json) 2>&1 | grep -v -E "$F" | grep -E "prefill|tok/s" | tail -3; }
{ echo "== prefill head"; pf head 2048,16384; for v in r4t2 r2t4; do echo "== prefill $v"; pf $v 2048; done; } 2>&1 | tee $OUT/prefill.txt
echo "== prof"; timeout 200 python3 .scratch/prof.py 2B > $OUT/prof.txt 2>&1; echo rc $?; grep -v -E "$F|_warn_once|UserWarning" $OUT/prof.txt | grep -E "==|round_k|gemm_k|attention|scan|conv|quantize|norm" | head -60
echo "== done"
