"""Replayed decode rounds on the cuda backend, and nothing else: a program for a kernel profiler to watch. One stream
by default, or `--streams` of them decoding side by side (a round of that many rows). The embedded model by default,
or one of bench's random checkpoints (`--config 2B`, written first as `tensorfold bench` writes it). Each round after
the first few replays one recording, so a profiler's per-kernel times between two draws (`argmax_part_kernel` or
`sample_kernel`) are one round's kernels.

    ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip 3000 --launch-count 800 \
        python3 tools/decode_rounds.py
    ncu --clock-control none --metrics gpu__time_duration.sum --csv \
        python3 tools/decode_rounds.py --config 2B --rounds 6
    ncu --clock-control none --graph-profiling graph --metrics gpu__time_duration.sum --csv \
        python3 tools/decode_rounds.py
    ncu --clock-control none --metrics gpu__time_duration.sum --csv \
        python3 tools/decode_rounds.py --config 2B --streams 16 --rounds 6

It prints the rounds recorded and replayed, and the second half's wall time a round. docs/performance.rst, "Where the
time goes" and "What bounds them", has what it showed.
"""
import argparse
import time

import tensorfold
from tensorfold.cli.bench.checkpoint import CONFIG_NAMES, checkpoint_folder, default_cache
from tensorfold.engine import Engine, SamplingParams


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", choices=CONFIG_NAMES,
                   help="a bench checkpoint's Qwen3.5 size (default: the embedded model)")
    p.add_argument("--rounds", type=int, default=36)
    p.add_argument("--streams", type=int, default=1, help="streams decoding side by side (default 1)")
    p.add_argument("--cache", default=None)
    args = p.parse_args()
    folder = checkpoint_folder(args.config, 0, args.cache or default_cache()) if args.config else None
    model = tensorfold.load(folder, backend="cuda")
    engine = Engine(model, parallel=args.streams, context=256)
    for stream in range(args.streams):  # prompts of their own, so that no stream's rows repeat another's
        engine.submit(list(range(1 + stream, 17 + stream)),
                      SamplingParams(max_tokens=args.rounds + 4, draft=False, stop_ids=()))
    half = args.rounds // 2
    for r in range(args.rounds):
        if r == half:
            model.backend.synchronize()
            started = time.perf_counter()
        engine.run_round()
    model.backend.synchronize()
    per_round = (time.perf_counter() - started) / (args.rounds - half)
    print(f"{args.rounds} rounds: {engine.graphs.recorded} recorded, {engine.graphs.replayed} replayed, "
          f"{per_round * 1e3:.3f} ms a round over the second half")


if __name__ == "__main__":
    main()
