echo "overlap-wait $(cat .scratch/HEAD_COMMIT)"; nvidia-smi --query-gpu=name --format=csv,noheader
TENSORFOLD_GRAPHS=1 timeout 200 python3 -m pytest --gpu -n 15 --timeout 150 -v --tb=line -rf -p no:cacheprovider \
  tests/test_draft_replay.py tests/test_dflash.py tests/test_block_drafter.py tests/test_replay_reuse.py tests/test_graphs.py \
  tests/test_gpu_lanes.py tests/test_launch.py tests/test_gpu.py tests/test_engine_draws.py tests/test_moe_exactness.py \
  tests/test_sampling.py tests/test_projections.py 2>&1 | grep -v -i "warn" > $OUT/call4.txt
grep -E "FAILED|ERROR|passed|failed|^/|Error" $OUT/call4.txt | cut -c1-300 | tail -60
