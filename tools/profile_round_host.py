"""The host's side of one-stream decode rounds: cProfile over rounds of the embedded model (replayed from recordings on
the cuda backend), undrafted or drafted by its block drafter, the functions that take the most time by their own
time and with what they call.

    python3 tools/profile_round_host.py [--backend cuda] [--rounds 400] [--draft none|chain|tree] [--top 25]

The rounds' wall time is printed beside the profile's, so what the profiler adds can be seen. docs/performance.rst,
"Where the time goes", has what it showed.
"""
import argparse
import cProfile
import io
import os
import pstats
import time

import tensorfold
from tensorfold.drafters import Drafter, make_drafter
from tensorfold.engine import Engine, SamplingParams


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="cuda", choices=("cuda", "numpy"))
    p.add_argument("--rounds", type=int, default=400)
    p.add_argument("--draft", default="none", choices=("none", "chain", "tree"))
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    model = tensorfold.load(backend=args.backend)
    drafting = args.draft != "none"
    drafter = make_drafter(os.path.join(model.path, "drafter"), model, args.draft) if drafting else Drafter()
    tokens = (16 if drafting else 1) * (2 * args.rounds + 16) + 32  # a drafted round yields up to 16 tokens
    engine = Engine(model, parallel=1, drafter=drafter, context=tokens + 32)
    params = SamplingParams(max_tokens=tokens, draft=drafting, stop_ids=())
    engine.submit(model.tokenizer.encode("ROMEO:\n"), params)
    for _ in range(16):  # the prompt, the recording and the kernels' compilation
        engine.run_round()
    model.backend.synchronize()
    started = time.perf_counter()
    for _ in range(args.rounds):
        engine.run_round()
    model.backend.synchronize()
    plain = time.perf_counter() - started
    profile = cProfile.Profile()
    started = time.perf_counter()
    profile.enable()
    for _ in range(args.rounds):
        engine.run_round()
    model.backend.synchronize()
    profile.disable()
    profiled = time.perf_counter() - started
    print(f"{args.rounds} rounds: {1e3 * plain / args.rounds:.3f} ms a round, "
          f"{1e3 * profiled / args.rounds:.3f} ms profiled")
    print_profile(profile, args.top)


def print_profile(profile, top: int) -> None:
    """The `top` functions of a cProfile profile by their own time, then by the time with what they call."""
    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(order).print_stats(top)
        print(out.getvalue())


if __name__ == "__main__":
    main()
