echo "main $(cat .scratch/HEAD_COMMIT); working tree: branch scan-fused (the fused scan in cuda/deltanet.py); .scratch/v7/main = main's code"; nvidia-smi --query-gpu=name --format=csv,noheader
S=.scratch/scan; V=$PWD/.scratch/v7
ln -sfn $PWD/tensorfold/models/tiny-shakespeare $V/main/tensorfold/models/tiny-shakespeare
{
for rows in 2048 16; do timeout 120 python3 -u $S/scanbench.py $rows 10 main=$S/deltanet_main.py fused=$S/deltanet_fused.py main=$S/deltanet_main.py fused=$S/deltanet_fused.py 2>&1 | grep -v NumbaPerf; done
for i in 1 2; do
echo "== prefill main $i"; (cd $V/main && PYTHONPATH=/tmp/site:$V/main timeout 100 python3 -u -m tensorfold.cli bench prefill --config 2B --no-peer --lengths 2048,16384 2>&1 | grep -E "^cold|rror")
echo "== prefill fused $i"; timeout 100 python3 -u -m tensorfold.cli bench prefill --config 2B --no-peer --lengths 2048,16384 2>&1 | grep -E "^cold|rror"
done
echo "== contract deltanet_scan (scan-fused)"; timeout 150 python3 -u -m tensorfold.cli contract --gpu --only deltanet_scan 2>&1 | grep -E "^PASS|^FAIL|^SUMMARY|rror" | cut -c1-200
} 2>&1 | tee $OUT/call2.txt
