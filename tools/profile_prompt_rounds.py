"""Where a round with a prompt chunk spends its time: a long prompt arrives beside decoding streams (as in `tensorfold
bench chunk`), and each of its rounds is timed, then profiled with cProfile.

    python3 tools/profile_prompt_rounds.py [--config 2B] [--backend cuda] [--chunk 128] [--prompt 4096]
                                           [--streams 4] [--top 30] [--no-gc]

It prints each round's milliseconds for three prompts of the same length: the first compiles, the second is timed,
the third is timed under the profiler, whose functions follow by their own time and with what they call. Every
round ends with the backend synchronised. `--no-gc` runs the timed prompts with Python's garbage collector off, to
see whether a collection is the one long round of a prompt (docs/performance.rst, "Prompt chunks").
"""
import argparse
import cProfile
import gc
import time

import numpy as np

import tensorfold
from tensorfold.cli.bench.checkpoint import CONFIG_NAMES, checkpoint_folder, default_cache
from tensorfold.engine import Engine, SamplingParams

from profile_round_host import print_profile  # this folder's (a script's own folder leads sys.path)


def prompt_rounds(engine, ids, profile=None) -> list:
    """Submit a prompt for one token and run rounds until it has it; each round's milliseconds."""
    request = engine.submit(ids, SamplingParams(max_tokens=1, draft=False, stop_ids=()))
    milliseconds = []
    while not request.output:
        started = time.perf_counter()
        if profile is not None:
            profile.enable()
        engine.run_round()
        engine.model.backend.synchronize()
        if profile is not None:
            profile.disable()
        milliseconds.append(1000 * (time.perf_counter() - started))
    return milliseconds


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="2B", choices=CONFIG_NAMES, help="the random checkpoint's Qwen3.5 size")
    p.add_argument("--cache", default=None, help=f"folder of the random checkpoints (default {default_cache()})")
    p.add_argument("--backend", default="cuda", choices=("cuda", "numpy"))
    p.add_argument("--chunk", type=int, default=128, help="prompt rows a round (default 128)")
    p.add_argument("--prompt", type=int, default=4096, help="tokens of the prompt that arrives (default 4096)")
    p.add_argument("--streams", type=int, default=4, help="streams decoding beside it (default 4)")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--no-gc", action="store_true", help="the timed prompts with the garbage collector off")
    args = p.parse_args()
    model = tensorfold.load(checkpoint_folder(args.config, 0, args.cache or default_cache()), backend=args.backend)
    rng = np.random.default_rng(0)
    vocab, decode_tokens = model.config.vocab_size, 3 * (args.prompt // args.chunk + 1) + 16
    engine = Engine(model, parallel=args.streams + 1, chunk=args.chunk, context=args.prompt + decode_tokens + 16)
    for _ in range(args.streams):
        engine.submit(rng.integers(0, vocab, 16), SamplingParams(max_tokens=decode_tokens, draft=False, stop_ids=()))
    for _ in range(8):  # the decoding streams' prompts and recordings
        engine.run_round()

    def show(name, milliseconds):
        print(f"{name}: {len(milliseconds)} rounds, {sum(milliseconds):,.1f} ms, the longest {max(milliseconds):,.1f} "
              f"(round {milliseconds.index(max(milliseconds))}):", " ".join(f"{m:.1f}" for m in milliseconds))

    show("compiling", prompt_rounds(engine, rng.integers(0, vocab, args.prompt).tolist()))
    if args.no_gc:
        gc.disable()
    show("timed", prompt_rounds(engine, rng.integers(0, vocab, args.prompt).tolist()))
    profile = cProfile.Profile()
    show("profiled", prompt_rounds(engine, rng.integers(0, vocab, args.prompt).tolist(), profile))
    gc.enable()
    print_profile(profile, args.top)


if __name__ == "__main__":
    main()
