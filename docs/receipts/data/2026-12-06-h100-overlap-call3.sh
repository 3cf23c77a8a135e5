echo "overlap-wait $(cat .scratch/HEAD_COMMIT) (main c15898b + overlapped launches)"; nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
{
for i in 1 2; do for o in 0 1; do
echo "== decode TENSORFOLD_OVERLAP=$o $i (t=$(( $(date +%s) - t0 )) s)"
TENSORFOLD_OVERLAP=$o timeout 100 python3 -u -m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64 --json $OUT/decode-overlap$o-$i.json 2>&1 | grep -E "^decode round, 1[6 ]|^drafted|rror|Traceback" | cut -c1-200
done; done
echo "== TENSORFOLD_GRAPHS=1 pytest --gpu -n 15 --timeout 300 (t=$(( $(date +%s) - t0 )) s)"
TENSORFOLD_GRAPHS=1 timeout $(( 585 - $(date +%s) + t0 )) python3 -m pytest --gpu -n 15 --timeout 300 -q -p no:cacheprovider 2>&1 | grep -v NumbaPerf | tail -25
echo "== done (t=$(( $(date +%s) - t0 )) s)"
} 2>&1 | tee $OUT/call3.txt
