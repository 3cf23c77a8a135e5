set -u
cat .scratch/HEAD_COMMIT; nvidia-smi --query-gpu=name --format=csv,noheader
echo "== contract gemm_affine"; timeout 90 python3 -m tensorfold.cli contract --gpu --only gemm_affine 2>&1 | grep -E "^PASS|^FAIL|^SUMMARY|rror"
echo "== decode"; timeout 80 python3 -m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64 --json $OUT/decode.json 2>&1 | grep -E "^decode round, 1[6 ]|^drafted|rror"
echo "== done"
