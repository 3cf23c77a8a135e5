"""Scratch: per-kernel device time a round (CUPTI via torch.profiler) and wall time a round, for the 35B-A3B's
decode (1 stream, 16 streams)."""
import collections, json, os, re, sys, time
import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile
import tensorfold
from tensorfold.cli.bench.checkpoint import checkpoint_folder, default_cache
from tensorfold.engine import Engine, SamplingParams

out = os.environ.get("OUT", "/tmp")
torch.cuda.init()
ROUNDS = 40


def short(name):
    tokens = re.findall(r"\d+([A-Za-z_][A-Za-z_0-9]*)", name)
    picked = [t for t in tokens if "kernel" in t or t.startswith("gemm") or t.startswith("round") or t.endswith("_")]
    return (picked[0] if picked else (tokens[3] if len(tokens) > 3 else name))[:40]


def measure(engine, label, res):
    be = engine.model.backend
    for _ in range(6):
        engine.run_round()
    be.synchronize()
    t0 = time.perf_counter(); n = 0
    while n < ROUNDS and engine.run_round():
        n += 1
    be.synchronize()
    wall = (time.perf_counter() - t0) / max(n, 1)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        m = 0
        while m < ROUNDS and engine.run_round():
            m += 1
        be.synchronize()
    per = collections.defaultdict(lambda: [0, 0.0])
    spans = []
    for e in prof.events():
        if getattr(e, "device_type", None) is not None and str(e.device_type).endswith("CUDA"):
            t = getattr(e, "device_time", None) or getattr(e, "cuda_time", 0) or 0
            k = short(e.name)
            per[k][0] += 1; per[k][1] += t
    m = max(m, 1)
    rows = sorted(((k, c / m, us / m) for k, (c, us) in per.items()), key=lambda r: -r[2])
    total = sum(r[2] for r in rows)
    launches = sum(r[1] for r in rows)
    print(f"== {label}: wall {wall * 1e3:.3f} ms a round ({n} rounds); kernels {total:.1f} us in {launches:.0f} "
          f"launches a round (profiled {m} rounds)", flush=True)
    for k, c, us in rows[:30]:
        print(f"  {k:40s} {c:7.1f} {us:9.1f} us", flush=True)
    res[label] = {"wall_ms": wall * 1e3, "kernels_us": total, "launches": launches, "table": rows}


def run(config, res):
    folder = checkpoint_folder(config, 0, default_cache())
    model = tensorfold.load(folder, backend="cuda")
    rng = np.random.default_rng(0)
    V = model.config.vocab_size
    budget = 120
    scen = [("1 stream", 1, {}), ("16 streams", 16, {})] if config else [("1 stream", 1, {})]
    for label, streams, kw in scen:
        tokens = budget * (16 if "chain" in label else 1)  # a chain round takes up to 16 tokens
        engine = Engine(model, parallel=streams, context=64 + tokens + 16, **kw)
        for s in range(streams):
            prompt = list(range(1 + s, 17 + s)) if config else model.tokenizer.encode("ROMEO:\n")
            engine.submit(prompt, SamplingParams(max_tokens=tokens, draft=bool(kw), stop_ids=()))
        engine.run_round()
        for st in engine.active:
            st.state.reserve(engine.context - st.state.length)
        measure(engine, f"{config or 'embedded'} {label}", res)
        del engine


res = {}
for config in sys.argv[1:]:
    run(None if config == "embedded" else config, res)
json.dump(res, open(os.path.join(out, "moe-prof-rounds.json"), "w"), indent=1)
