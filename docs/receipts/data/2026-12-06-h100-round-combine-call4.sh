set -u
cat .scratch/HEAD_COMMIT; nvidia-smi --query-gpu=name --format=csv,noheader
echo "== pytest --gpu the lanes' recordings"; TENSORFOLD_GRAPHS=1 timeout 150 python3 -m pytest --gpu -n 0 -p no:cacheprovider -q -rfE --tb=short tests/test_draft_replay.py -k every_lanes 2>&1 | grep -v -i "warning" | tail -4
echo "== decode final"; timeout 100 python3 -m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64 --json $OUT/decode-final.json 2>&1 | grep -v -i warn | grep -E "^decode round, 1[6 ]|^drafted"
echo "== drafter"; timeout 200 python3 -m tensorfold.cli bench drafter --backend cuda --tokens 128 --json $OUT/drafter.json 2>&1 | grep -v -i warn | tail -14
echo "== done"
