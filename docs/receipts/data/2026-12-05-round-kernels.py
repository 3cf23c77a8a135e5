"""Scratch: per-kernel device time inside the 2B's recorded rounds (1-row forward, 16-row forward, the keep of a
16-row path), from CUPTI through torch.profiler."""
import collections, json, os, re, sys, time
import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile
import tensorfold
from tensorfold.cli.bench.checkpoint import checkpoint_folder
from tensorfold.cli.bench.local import FullChains
from tensorfold.engine import Engine, SamplingParams

out = os.environ.get("OUT", "/tmp")
config = sys.argv[1] if len(sys.argv) > 1 else "2B"
model = tensorfold.load(checkpoint_folder(config, 0, "/tmp/tfcache"), backend="cuda")
be = model.backend
rng = np.random.default_rng(0)
V = model.config.vocab_size
torch.cuda.init()


def short(name):
    tokens = re.findall(r"\d+([A-Za-z_][A-Za-z_0-9]*)", name)
    picked = [t for t in tokens if "kernel" in t or t.startswith("gemm") or t.endswith("_")]
    return (picked[0] if picked else (tokens[3] if len(tokens) > 3 else name))[:48]


def kernels(fn, reps=10):
    fn(); be.synchronize()
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
    rows = sorted(((k, c / reps, us / reps) for k, (c, us) in per.items()), key=lambda r: -r[2])
    return rows


def engine_for(rows):
    drafting = {"drafter": FullChains(), "max_draft": rows - 1} if rows > 1 else {}
    budget = 40 * rows
    engine = Engine(model, parallel=1, context=32 + budget + rows, **drafting)
    engine.submit(rng.integers(0, V, 32), SamplingParams(max_tokens=budget, draft=rows > 1, stop_ids=()))
    engine.run_round()
    st = engine.active[0].state
    st.reserve(engine.context - st.length)
    for _ in range(4):
        engine.run_round()
    return engine


res = {}
for rows in (1, 16):
    engine = engine_for(rows)
    rec = list(engine.graphs.recordings.values())[-1]
    table = kernels(rec.graph.replay)
    res[f"forward{rows}"] = table
    total = sum(r[2] for r in table)
    print(f"== forward graph, {rows} rows: {total:.1f} us of kernels a replay")
    for k, c, us in table[:30]:
        print(f"  {k:48s} {c:6.1f} {us:9.1f} us")
    if rec.keep is not None:
        rec.paths[0, 0] = engine.active[0].state.length
        rec.paths[0, 1:] = np.arange(16)
        table = kernels(rec.keep.replay)
        res["keep16"] = table
        print(f"== keep graph, a 16-row path: {sum(r[2] for r in table):.1f} us of kernels a replay")
        for k, c, us in table[:12]:
            print(f"  {k:48s} {c:6.1f} {us:9.1f} us")
json.dump(res, open(os.path.join(out, f"kprof-{config}.json"), "w"), indent=1)
