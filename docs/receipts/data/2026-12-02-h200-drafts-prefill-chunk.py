"""Scratch: the second 128-row prompt chunk of a 256-token prompt, random 2B checkpoint, run eagerly.

`ncu`: the chunk between cuda.profile_start and profile_stop (run under ncu --profile-from-start off), then timed
three times. `profile`: the chunk timed three times, then once under cProfile."""
import cProfile
import io
import pstats
import sys
import time

import numpy as np
from numba import cuda

import tensorfold
from tensorfold import bench_local as bl

mode = sys.argv[1]
model = tensorfold.load(bl.checkpoint_folder("2B", 0, "/tmp/tfcache"), backend="cuda")
ids = np.random.default_rng(0).integers(0, model.config.vocab_size, 256).tolist()
model.prefill(ids, model.net.new_state(max_rows=256))  # compiles every kernel


def second_chunk(around=None):
    """The chunk after the first 128 rows, in seconds; `around` is a (start, stop) pair wrapped around it."""
    state = model.net.new_state(max_rows=256)
    model.prefill(ids[:128], state)
    model.backend.synchronize()
    started = time.perf_counter()
    if around:
        around[0]()
    model.backend.to_host(model.prefill(ids[128:], state))
    model.backend.synchronize()
    if around:
        around[1]()
    return time.perf_counter() - started


if mode == "ncu":
    second_chunk((cuda.profile_start, cuda.profile_stop))
print("second chunk alone (ms):", [round(1000 * second_chunk(), 1) for _ in range(3)], flush=True)
if mode == "profile":
    profile = cProfile.Profile()
    second_chunk((profile.enable, profile.disable))
    for order, count in (("tottime", 35), ("cumulative", 45)):
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats(order).print_stats(count)
        print(text.getvalue())
