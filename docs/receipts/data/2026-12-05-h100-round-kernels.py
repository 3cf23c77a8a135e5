"""Scratch: per-kernel device time of a recorded undrafted decode round at N streams (torch.profiler / CUPTI), for
any bench preset.  python3 kprof_streams.py CONFIG STREAMS... (writes $OUT/kprof-CONFIG-TAG.json)"""
import collections, json, os, re, sys, time
import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile
import tensorfold
from tensorfold.cli.bench.checkpoint import checkpoint_folder
from tensorfold.engine import Engine, SamplingParams

out, tag = os.environ.get("OUT", "/tmp"), os.environ.get("TAG", "head")
config, streams = sys.argv[1], [int(s) for s in sys.argv[2:]] or [1, 16]
t0 = time.time()
model = tensorfold.load(checkpoint_folder(config, 0, "/tmp/tfcache"), backend="cuda")
print(f"loaded {config} in {time.time() - t0:.1f} s", flush=True)
be = model.backend
rng = np.random.default_rng(0)
V = model.config.vocab_size
torch.cuda.is_available() and torch.cuda.init()


def short(name):
    tokens = re.findall(r"\d+([A-Za-z_][A-Za-z_0-9]*)", name)
    picked = [t for t in tokens if "kernel" in t or t.startswith("gemm") or t.startswith("grouped") or t.endswith("_")]
    return (picked[0] if picked else (tokens[3] if len(tokens) > 3 else name))[:48]


def kernels(fn, reps=10):
    fn(); be.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    be.synchronize()
    wall = (time.perf_counter() - start) / reps * 1e6
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        be.synchronize()
    per = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if getattr(e, "device_type", None) is not None and str(e.device_type).endswith("CUDA"):
            t = getattr(e, "device_time", None) or getattr(e, "cuda_time", 0) or 0
            k = short(e.name)
            per[k][0] += 1; per[k][1] += t
    return wall, sorted(((k, c / reps, us / reps) for k, (c, us) in per.items()), key=lambda r: -r[2])


res = {}
for n in streams:
    engine = Engine(model, parallel=n, context=256)
    for _ in range(n):
        engine.submit(rng.integers(0, V, 16), SamplingParams(max_tokens=64, stop_ids=()))
    for _ in range(6):
        engine.run_round()
    rec = list(engine.graphs.recordings.values())[-1]
    wall, table = kernels(rec.graph.replay)
    res[f"streams{n}"] = {"replay_us": wall, "kernels": table}
    print(f"== {config}, {n} streams: a replay {wall:.1f} us wall, {sum(r[2] for r in table):.1f} us of kernels, "
          f"{sum(r[1] for r in table):.0f} launches", flush=True)
    for k, c, us in table[:25]:
        print(f"  {k:48s} {c:7.1f} {us:9.1f} us")
    del engine
json.dump(res, open(os.path.join(out, f"kprof-{config}-{tag}.json"), "w"), indent=1)
