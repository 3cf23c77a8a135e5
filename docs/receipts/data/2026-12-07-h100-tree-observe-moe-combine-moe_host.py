"""Host profile of one 2,048-row forward of the 35B-A3B (bench's random checkpoint), after two warm-ups."""
import cProfile
import pstats
import sys
import time

import numpy as np

import tensorfold
from tensorfold.cli.bench.checkpoint import checkpoint_folder, default_cache

config = sys.argv[1] if len(sys.argv) > 1 else "35B-A3B"
model = tensorfold.load(checkpoint_folder(config, 0, default_cache()), backend="cuda")
ids = np.random.default_rng(0).integers(0, model.config.vocab_size, 2048).tolist()
net, backend = model.net, model.backend
for _ in range(2):
    net.forward(ids, net.new_state(), "last")
    backend.synchronize()
for _ in range(2):
    state = net.new_state()
    backend.synchronize()
    t0 = time.perf_counter()
    net.forward(ids, state, "last")
    t1 = time.perf_counter()
    backend.synchronize()
    t2 = time.perf_counter()
    print(f"{config}: forward of 2048 rows: host returns {1e3 * (t1 - t0):.1f} ms, device done {1e3 * (t2 - t0):.1f} ms")
profile = cProfile.Profile()
state = net.new_state()
backend.synchronize()
profile.enable()
net.forward(ids, state, "last")
backend.synchronize()
profile.disable()
pstats.Stats(profile).sort_stats("tottime").print_stats(30)
