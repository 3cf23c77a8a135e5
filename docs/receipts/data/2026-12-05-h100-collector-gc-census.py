"""GC census: how many objects the collector tracks after load, what a full collection costs, and the pauses
(by generation) during a prefill, a chunked-prompt + decode run and one-stream decode; then the same after
gc.freeze().  usage: gc_census.py CONFIG [freeze-first]"""
import gc, sys, time, collections
import numpy as np
import tensorfold
from tensorfold.cli.bench.checkpoint import checkpoint_folder, default_cache
from tensorfold.cli.bench.local import prefill_rate, decode_rate

config = sys.argv[1]
t = time.perf_counter()
model = tensorfold.load(checkpoint_folder(config, 0, default_cache()), backend="cuda")
print(f"load {time.perf_counter() - t:.1f} s; tracked objects {len(gc.get_objects()):,}", flush=True)
pauses = []
def callback(phase, info):
    if phase == "start":
        callback.t = time.perf_counter()
    else:
        pauses.append((info["generation"], time.perf_counter() - callback.t))
gc.callbacks.append(callback)

def census(label):
    by = collections.defaultdict(list)
    for g, s in pauses:
        by[g].append(s)
    parts = [f"gen{g}: {len(v)} x, {1e3 * sum(v):.1f} ms, max {1e3 * max(v):.1f}" for g, v in sorted(by.items())]
    print(f"  {label}: " + "; ".join(parts), flush=True)
    pauses.clear()

def runs(tag):
    rng = np.random.default_rng(0)
    t = time.perf_counter(); gc.collect(); print(f"[{tag}] full collect {1e3 * (time.perf_counter() - t):.1f} ms; "
                                                 f"tracked {len(gc.get_objects()):,}", flush=True)
    pauses.clear()
    for length in (512, 2048):
        for _ in range(2):
            r = prefill_rate(model, length, rng)
            print(f"[{tag}] prefill {length}: {r['tok_s']:,.1f} tok/s ({r['seconds']:.3f} s)", flush=True)
            census("prefill")
    for streams in (1, 16):
        r = decode_rate(model, streams, 128, 8, 64, rng)
        print(f"[{tag}] decode {streams} streams: {r['tok_s']:,.1f} tok/s ({r['ms_per_round']:.2f} ms a round)",
              flush=True)
        census("decode")

if len(sys.argv) > 2:
    gc.collect(); gc.freeze()
    runs("frozen at load")
else:
    runs("plain")
    gc.collect(); gc.freeze()
    runs("frozen after warm-up")
