"""Which of `tensorfold bench all`'s decode measurements slows the prefill measured after them: the cold prefill of
one length (the faster of two runs, as bench does) alone, then again after each step of bench's `run_decode` in turn.

    python3 tools/profile_bench_prefill.py [--config 35B-A3B] [--backend cuda] [--length 2048] [--streams 16]

On an H100 the 35B-A3B's prefill of 2,048 tokens ran at 3,554 to 3,675 tok/s alone and at 2,208 after the decode
measurements in one `bench all` (docs/performance.rst, "The figures"); this prints the figure after each step, so
the step after which it drops is the one to look into.
"""
import argparse

import numpy as np

import tensorfold
from tensorfold.cli.bench import local, timing
from tensorfold.cli.bench.checkpoint import CONFIG_NAMES, checkpoint_folder, default_cache


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="35B-A3B", choices=CONFIG_NAMES)
    p.add_argument("--backend", default="cuda", choices=("cuda", "numpy"))
    p.add_argument("--length", type=int, default=2048)
    p.add_argument("--streams", type=int, default=16, help="the larger decode measurement's streams")
    p.add_argument("--cache", default=None)
    args = p.parse_args()
    model = tensorfold.load(checkpoint_folder(args.config, 0, args.cache or default_cache()), backend=args.backend)
    rng = np.random.default_rng(0)
    model.prefill(rng.integers(0, model.config.vocab_size, local.WARMUP_PROMPT).tolist(), model.net.new_state())

    def prefill(after: str) -> None:
        result = min((local.prefill_rate(model, args.length, rng) for _ in range(2)), key=lambda r: r["seconds"])
        print(f"{after:34s} prefill of {args.length}: {result['tok_s']:,.1f} tok/s ({result['seconds']:.3f} s)",
              flush=True)

    steps = [("one stream's decode", lambda: local.decode_rate(model, 1, 64, 8, 16, rng)),
             ("its calls counted", lambda: timing.calls_per_round(model, 1)),
             (f"{args.streams} streams' decode", lambda: local.decode_rate(model, args.streams, 64, 8, 16, rng)),
             ("a drafted round's decode", lambda: local.decode_rate(model, 1, 64, 8, 16, rng, rows=16)),
             ("each op timed alone", lambda: timing.ops_per_round(model)),
             ("a launch timed", lambda: timing.op_seconds(model.backend)),
             ("the copy bandwidth", lambda: timing.copy_bandwidth(model.backend, 1 << 30, repeats=5))]
    prefill("alone")
    for name, step in steps:
        step()
        prefill(f"after {name}")


if __name__ == "__main__":
    main()
