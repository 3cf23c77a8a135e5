"""Scratch: where a 2B drafted round's time goes (host phases, device time of its graphs, recordings)."""
import cProfile, io, json, os, pstats, sys, time
import numpy as np
import tensorfold
from tensorfold.cli.bench.checkpoint import checkpoint_folder
from tensorfold.cli.bench.local import FullChains
from tensorfold.engine import Engine, SamplingParams
from tensorfold.model import replay

out = os.environ.get("OUT", "/tmp")
config = sys.argv[1] if len(sys.argv) > 1 else "2B"
folder = checkpoint_folder(config, 0, "/tmp/tfcache")
model = tensorfold.load(folder, backend="cuda")
be = model.backend
res = {}
REPS = int(os.environ.get("REPS", "20"))
ROUNDS = int(os.environ.get("ROUNDS", "48"))
rng = np.random.default_rng(0)
V = model.config.vocab_size

# phase timers (host wall time, no added syncs)
phases = {}
def timed(name, fn):
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - t
    return wrapper
Engine._after = timed("after (walk+keep+observe)", Engine._after)
Engine._window = timed("window (propose)", Engine._window)
Engine._draws = timed("draws", Engine._draws)
replay.DecodeGraphs.run = timed("graphs.run (issue)", replay.DecodeGraphs.run)
replay.DecodeGraphs.keep_round = timed("keep_round", replay.DecodeGraphs.keep_round)
replay.DecodeGraphs._record = timed("record forward", replay.DecodeGraphs._record)
replay.DecodeGraphs._record_keep = timed("record keep", replay.DecodeGraphs._record_keep)
replay.Drawn.tokens = timed("Drawn.tokens (wait)", replay.Drawn.tokens)
replay.DecodeGraphs.write_integers = timed("write_integers", replay.DecodeGraphs.write_integers)

def measure(rows, rounds=ROUNDS, warmup=6, reserve=True, profile=False):
    drafting = {"drafter": FullChains(), "max_draft": rows - 1} if rows > 1 else {}
    budget = (warmup + rounds + 4) * rows
    engine = Engine(model, parallel=1, context=32 + budget + rows, **drafting)
    req = engine.submit(rng.integers(0, V, 32), SamplingParams(max_tokens=budget, draft=rows > 1, stop_ids=()))
    engine.run_round()
    if reserve:  # room for every row up front: no buffer growth, no new recording while timed
        st = engine.active[0].state
        st.reserve(engine.context - st.length)
    for _ in range(warmup):
        engine.run_round()
    phases.clear()
    rec0 = engine.graphs.recorded
    be.synchronize()
    per = []
    prof = cProfile.Profile() if profile else None
    t0 = time.perf_counter()
    if prof: prof.enable()
    for _ in range(rounds):
        t = time.perf_counter()
        engine.run_round()
        per.append(time.perf_counter() - t)
    if prof: prof.disable()
    be.synchronize()
    total = time.perf_counter() - t0
    r = {"rows": rows, "reserve": reserve, "ms_round": 1000 * total / rounds, "recorded": engine.graphs.recorded - rec0,
         "per_round_ms_sorted": sorted(round(1000 * p, 3) for p in per),
         "phases_ms_per_round": {k: 1000 * v / rounds for k, v in phases.items()}}
    # device time of the recorded graphs alone
    for key, rec in list(engine.graphs.recordings.items())[-1:]:
        be.synchronize(); t = time.perf_counter()
        for _ in range(REPS): rec.graph.replay()
        be.synchronize(); r["forward_graph_ms"] = 1000 * (time.perf_counter() - t) / REPS
        if rec.keep is not None:
            rec.paths[...] = -1
            be.synchronize(); t = time.perf_counter()
            for _ in range(REPS): rec.keep.replay()
            be.synchronize(); r["keep_graph_ms"] = 1000 * (time.perf_counter() - t) / REPS
    if prof:
        s = io.StringIO(); pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(35); r["profile"] = s.getvalue()
        s = io.StringIO(); pstats.Stats(prof, stream=s).sort_stats("cumtime").print_stats(40); r["profile_cum"] = s.getvalue()
    print(json.dumps({k: v for k, v in r.items() if not k.startswith("profile")}, indent=1), flush=True)
    if prof:
        print(r["profile"]); print(r["profile_cum"])
    return r

res["one"] = measure(1)
res["d16_noreserve"] = measure(16, reserve=False)
res["d16"] = measure(16)
res["d16_prof"] = measure(16, profile=True)
res["one_prof"] = measure(1, profile=True)
json.dump(res, open(os.path.join(out, f"draftprof-{config}.json"), "w"), indent=1)
