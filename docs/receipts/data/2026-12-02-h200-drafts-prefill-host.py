"""Scratch: the host's time in one eager 128-row prompt chunk of a random 2B checkpoint: the chunk timed, then cProfile."""
import cProfile, pstats, time, io
import numpy as np
import tensorfold
from tensorfold import bench_local as bl

model = tensorfold.load(bl.checkpoint_folder("2B", 0, "/tmp/tfcache"), backend="cuda")
rng = np.random.default_rng(0)
ids = rng.integers(0, model.config.vocab_size, 256).tolist()
model.prefill(ids, model.net.new_state(max_rows=256))
def chunk():
    state = model.net.new_state(max_rows=256)
    model.prefill(ids[:128], state)
    model.backend.synchronize()
    t = time.perf_counter()
    model.backend.to_host(model.prefill(ids[128:], state))
    model.backend.synchronize()
    return time.perf_counter() - t
print("chunk ms", [round(1000 * chunk(), 1) for _ in range(3)])
state = model.net.new_state(max_rows=256)
model.prefill(ids[:128], state)
model.backend.synchronize()
prof = cProfile.Profile()
prof.enable()
model.backend.to_host(model.prefill(ids[128:], state))
model.backend.synchronize()
prof.disable()
s = io.StringIO()
pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(35)
print(s.getvalue()[:9000])
s = io.StringIO()
pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(45)
print(s.getvalue()[:9000])
