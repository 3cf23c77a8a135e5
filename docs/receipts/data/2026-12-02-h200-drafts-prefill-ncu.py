"""Scratch: one 128-row prompt chunk of a random 2B checkpoint (after 128 rows already in the state), for ncu."""
import numpy as np
from numba import cuda
import tensorfold
from tensorfold import bench_local as bl

model = tensorfold.load(bl.checkpoint_folder("2B", 0, "/tmp/tfcache"), backend="cuda")
rng = np.random.default_rng(0)
ids = rng.integers(0, model.config.vocab_size, 256).tolist()
model.prefill(ids, model.net.new_state(max_rows=256))  # compiles every kernel
state = model.net.new_state(max_rows=256)
model.prefill(ids[:128], state)
model.backend.synchronize()
cuda.profile_start()
model.backend.to_host(model.prefill(ids[128:], state))
model.backend.synchronize()
cuda.profile_stop()
import time
for _ in range(3):
    state = model.net.new_state(max_rows=256)
    model.prefill(ids[:128], state)
    model.backend.synchronize()
    t = time.perf_counter()
    model.backend.to_host(model.prefill(ids[128:], state))
    model.backend.synchronize()
    print(f"second chunk alone: {1000 * (time.perf_counter() - t):.1f} ms", flush=True)
