# main as merged: the tile kernel built for a call's tile, on the GPU; the kv family's checks; one decode run.
git log --oneline -1 2>/dev/null || true; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
{
echo "== contract tile"; timeout 120 python3 -u -m tensorfold.cli contract --gpu --only attention_partial_tile | grep -E "^PASS|^FAIL|^SUMMARY|rror"
echo "== contract kv"; timeout 40 python3 -u -m tensorfold.cli contract --gpu --only kv | grep -E "^PASS|^FAIL|^SUMMARY|rror"
echo "== decode"; timeout 60 python3 -u -m tensorfold.cli bench decode --config 2B --no-peer --streams 1 --tokens 64 | grep -E "^decode round, 1 |^drafted|rror"
echo "== done"
} 2>&1 | tee $OUT/verify.txt | tail -c 6000
