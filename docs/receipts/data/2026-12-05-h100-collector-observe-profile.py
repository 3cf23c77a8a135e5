"""Host time of the block drafter's observe in drafted (chain) rounds and watched undrafted rounds of the embedded
model: each call timed without synchronizing, then cProfile of the chain run's observe calls."""
import cProfile, os, pstats, sys, time
import tensorfold
from tensorfold.drafters import make_drafter, Drafter
from tensorfold.cli.bench.drafter import decode, PROMPTS, SAMPLINGS

model = tensorfold.load(None, backend=os.environ.get("BACKEND", "cuda"))
prompts = [model.tokenizer.encode(p) for p in PROMPTS]
chain = make_drafter(os.path.join(model.path, "drafter"), model, "chain", None)
observe = chain.observe
times, profiler = [], cProfile.Profile()
def timed(*args, **kwargs):
    started = time.perf_counter()
    profiler.enable()
    try:
        return observe(*args, **kwargs)
    finally:
        profiler.disable()
        times.append(time.perf_counter() - started)
chain.observe = timed
for sampling in ("greedy", "T=0.8"):
    times.clear()
    result = decode(model, chain, prompts, int(sys.argv[1]) if len(sys.argv) > 1 else 128, SAMPLINGS[sampling])
    print(f"{sampling} chain {result['tok_s']:.1f} tok/s, rounds {result['rounds']}, observe calls {len(times)}, "
          f"mean {1e3 * sum(times) / len(times):.3f} ms, median {1e3 * sorted(times)[len(times) // 2]:.3f} ms", flush=True)
pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
