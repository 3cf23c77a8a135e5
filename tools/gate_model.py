"""The draft gate's own cost, in a model: `DraftGate` (tensorfold/drafters/gate.py) deciding the rounds of one stream
whose rounds cost what `tensorfold bench drafter` measured, with no GPU.

Each round costs `--undrafted` ms, a drafted round `--drafted` ms and an undrafted round the drafter watches
`--upkeep` ms more; a drafted round gives 1 + G tokens, G geometric with the mean that makes `--tau` tokens a drafted
round (at most 16). A warm-up request runs first on the same gate, as `bench drafter` runs one, then `--requests`
requests of `--tokens` tokens are timed. It prints auto's decode rate over undrafted decode's, the mean over
`--seeds` runs. The defaults are the embedded model on an H100 (receipt 2026-12-07-h100-tree-observe-moe-combine):
undrafted 0.47 ms a round, a drafted chain round 1.57 ms, tau 1.74 at T = 0.8 and 7.68 greedy.

    python tools/gate_model.py                 # T = 0.8
    python tools/gate_model.py --tau 7.68      # greedy
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tensorfold.drafters.gate import DraftGate  # noqa: E402

MOST_TOKENS = 16  # a drafted round's rows: its guesses and the model's own token


def auto_over_undrafted(args, seed: int) -> float:
    rng = np.random.default_rng(seed)
    now = [0.0]  # the model's clock, in seconds
    gate = DraftGate(clock=lambda: now[0])
    timed = 0.0
    for request in range(args.requests + 1):  # request 0: the warm-up
        mean, measured, produced, started = None, 0, 0, now[0]
        while produced < args.tokens:
            drafting = gate.drafts(1, [mean])
            gate.start()
            watched = not drafting and gate.watching(1)
            now[0] += (args.drafted if drafting else args.undrafted + args.upkeep * watched) / 1e3
            gate.finish(1, drafting, False)
            got = 1
            if drafting:
                got = min(rng.geometric(1 / args.tau), MOST_TOKENS)  # mean tau
                mean, measured = gate.tokens_after(mean, got, measured)
            produced += got
        if request:
            timed += now[0] - started
    return args.requests * args.tokens * args.undrafted / 1e3 / timed


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tau", type=float, default=1.74, help="mean tokens a drafted round gives")
    p.add_argument("--undrafted", type=float, default=0.47, help="ms an undrafted round")
    p.add_argument("--drafted", type=float, default=1.57, help="ms a drafted round")
    p.add_argument("--upkeep", type=float, default=0.5, help="ms more an undrafted round the drafter watches")
    p.add_argument("--tokens", type=int, default=128, help="tokens a request")
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--seeds", type=int, default=20)
    args = p.parse_args()
    ratios = [auto_over_undrafted(args, seed) for seed in range(args.seeds)]
    print(f"auto over undrafted: {np.mean(ratios):.3f} (runs {min(ratios):.3f} to {max(ratios):.3f})")


if __name__ == "__main__":
    main()
