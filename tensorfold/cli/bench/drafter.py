"""`tensorfold bench drafter`: what drafting buys, in this process. The same prompts are decoded one stream at a
time without drafts, with the drafter's chains, with its trees, and with its chains behind the gate that "auto"
puts in front of a drafter (`auto`: a round drafts only while the engine measures that drafting pays,
drafters/gate.py); for each, the mean acceptance length (tokens per
drafted round, the model's own token included), the decode rate (output tokens over the time from the first
token to the last, so the prompt pass is left out) and, where rounds replay, how many recordings they made. Every
drafted output must equal the undrafted one (by token sha256): a mismatch is reported and fails the run.

By default: the embedded model and its own block drafter (`drafter/` beside its weights), greedy and seeded
sampling (T = 0.8), 256 tokens for each of four prompts from the plays, after one untimed warm-up request through
the same engine (it compiles the kernels and records the lane's rounds).

With `--phases`, each mode's rounds are also split into where their time goes: the window (the drafter's proposal),
the forward (replayed or launch by launch), the draws (sampling, and the tokens back to the host) and the rest of
the round (the walk, the keep and its recorded replay, the drafter's observation). The backend is synchronized at
the end of each phase, so the device's time is counted in the phase that launched it, at the price of the overlap a
round would otherwise have.
"""
import collections
import hashlib
import json
import os
import time

import numpy as np

PROMPTS = ("ROMEO:\n", "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n",
           "KING HENRY:\nOnce more unto the breach, dear friends, once more;\n",
           "HAMLET:\nTo be, or not to be, that is the question:\n")
SAMPLINGS = {"greedy": {"temperature": 0.0}, "T=0.8": {"temperature": 0.8, "seed": 7}}


def token_sha256(ids) -> str:
    return hashlib.sha256(np.asarray(ids, "<i4").tobytes()).hexdigest()


PHASES = ("window", "forward", "draws", "after")


class PhaseClock:
    """Seconds per phase of an engine's decode rounds: wraps the engine's per-round steps, each ended by a
    synchronize, and counts while `on`."""

    def __init__(self, engine):
        self.seconds, self.on, self.inside = collections.Counter(), False, False
        self.synchronize = engine.model.backend.synchronize
        engine._window = self.timed("window", engine._window)
        engine._draws = self.timed("draws", engine._draws)
        engine._after = self.timed("after", engine._after)
        self.net = engine.model.net  # wrapped on the instance, and unwrapped by `close`: the model serves on
        self.net.forward_logits = self.timed("forward", self.net.forward_logits)
        if engine.graphs is not None:
            engine.graphs.run = self.timed("forward", engine.graphs.run)
            engine.graphs.keep_round = self.timed("after", engine.graphs.keep_round)

    def timed(self, phase: str, step):
        def call(*args, **kwargs):
            if not self.on or self.inside:  # a step inside a phase (a recording's forward) is that phase's
                return step(*args, **kwargs)
            self.inside, start = True, time.perf_counter()
            try:
                result = step(*args, **kwargs)
                self.synchronize()
            finally:
                self.inside = False
            self.seconds[phase] += time.perf_counter() - start
            return result
        return call

    def close(self) -> None:
        del self.net.forward_logits

    def per_round(self, seconds: float, rounds: int) -> dict:
        """Milliseconds per round of each phase, and of the rounds' other work (`seconds` over `rounds` in all)."""
        shares = {phase: 1e3 * self.seconds[phase] / rounds for phase in PHASES}
        return {**shares, "other": 1e3 * seconds / rounds - sum(shares.values())}


def decode(model, drafter, prompts, tokens: int, sampling: dict, phases: bool = False, gated: bool = False) -> dict:
    """Each prompt alone through an engine with `drafter` (behind a `DraftGate` when `gated`), after an untimed
    warm-up request through the same engine (it compiles the kernels and makes the lane's recordings, as a serving
    engine's first requests do): the outputs' hashes, the decode rate, acceptance and the recordings made while
    timed; with `phases`, the milliseconds per decode round of each phase (`PhaseClock`). The context holds a whole
    drafted window past every request's end, so that a window never shrinks (a new shape, a new recording)."""
    from tensorfold.drafters import DraftGate
    from tensorfold.engine import Engine, SamplingParams
    from tensorfold.model.replay import MAX_ROWS
    engine = Engine(model, parallel=1, drafter=drafter, context=max(len(p) for p in prompts) + tokens + MAX_ROWS,
                    gate=DraftGate() if gated else None)
    warmup = engine.submit(prompts[0], SamplingParams(max_tokens=min(tokens, 32), stop_ids=(), **sampling))
    while warmup.finish_reason is None and engine.run_round():
        pass
    recorded = (engine.graphs.recorded if engine.graphs is not None else 0) + drafter.recordings
    clock = PhaseClock(engine) if phases else None
    hashes, seconds, output, accepted, draft_rounds, rounds, decode_rounds = [], 0.0, 0, 0, 0, 0, 0
    for prompt in prompts:
        request = engine.submit(prompt, SamplingParams(max_tokens=tokens, stop_ids=(), **sampling))
        while request.first_token_at is None and engine.run_round():  # the prompt pass, outside the phases
            pass
        first_round = engine.rounds
        if clock is not None:
            clock.on = True
        while engine.run_round():
            pass
        ended = time.perf_counter()
        if clock is not None:
            clock.on = False
        if request.finish_reason == "error":
            raise request.error
        decode_rounds += engine.rounds - first_round
        hashes.append(token_sha256(request.output))
        seconds += ended - request.first_token_at
        output += len(request.output) - 1  # the first token comes with the prompt pass, outside the timing
        accepted, draft_rounds = accepted + request.stats.accepted, draft_rounds + request.stats.draft_rounds
        rounds += request.stats.rounds
    graphs = engine.graphs
    result = {"hashes": hashes, "tok_s": output / seconds, "rounds": rounds,
              "tau": (accepted + draft_rounds) / draft_rounds if draft_rounds else None,
              "recordings": None if graphs is None else {"recorded": graphs.recorded, "replayed": graphs.replayed,
                                                         "recorded_while_timed": graphs.recorded + drafter.recordings
                                                         - recorded}}
    if clock is not None:
        clock.close()
        result["phases_ms"] = clock.per_round(seconds, decode_rounds)
    return result


def run(args) -> int:
    import tensorfold
    from tensorfold.drafters import Drafter, make_drafter

    model = tensorfold.load(args.model, backend=args.backend)
    name = args.drafter or os.path.join(model.path, "drafter")
    chain = make_drafter(name, model, "chain", args.draft_rows)
    tree = make_drafter(name, model, "tree", args.draft_rows)
    modes = {"none": (Drafter(), False), "chain": (chain, False), "tree": (tree, False), "auto": (chain, True)}
    prompts = [model.tokenizer.encode(p) for p in PROMPTS[:args.prompts]]
    print(f"# {model.path} on {model.backend.name}; drafter {chain.name}; {len(prompts)} prompts x "
          f"{args.tokens} tokens, one stream at a time", flush=True)
    results, failed = {}, False
    for name, sampling in SAMPLINGS.items():
        for mode, (drafter, gated) in modes.items():
            result = decode(model, drafter, prompts, args.tokens, sampling, gated=gated)
            if args.phases:  # a run of its own: the synchronizes slow it down
                result["phases_ms"] = decode(model, drafter, prompts, args.tokens, sampling, True, gated)["phases_ms"]
            results[f"{name} {mode}"] = result
            equal = result["hashes"] == results[f"{name} none"]["hashes"]
            failed |= not equal
            tau = f"{result['tau']:6.2f}" if result["tau"] else "     -"
            replays = result["recordings"]
            replays = (f"  recorded {replays['recorded']} / replayed {replays['replayed']} (recorded while timed, "
                       f"drafter's too: {replays['recorded_while_timed']})" if replays else "")
            print(f"{name:7} {mode:6} decode {result['tok_s']:8.1f} tok/s  tau {tau}  rounds {result['rounds']:5}  "
                  f"{'equal to undrafted' if equal else 'DIFFERS FROM UNDRAFTED'}{replays}", flush=True)
            if args.phases:
                print("                ms a round: " + "  ".join(
                    f"{phase} {ms:.3f}" for phase, ms in result["phases_ms"].items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": model.path, "backend": model.backend.name, "tokens": args.tokens,
                       "prompts": len(prompts), "results": results}, f, indent=1)
    return 1 if failed else 0


def add_parser(kinds) -> None:
    p = kinds.add_parser("drafter", help="acceptance and decode rate with and without drafts, in this process")
    p.add_argument("--model", help="checkpoint folder or hub id (default: the embedded model)")
    p.add_argument("--drafter", help="a block drafter folder, or ngram (default: the model's drafter/ folder)")
    p.add_argument("--backend", default="auto", choices=("auto", "numpy", "cuda"))
    p.add_argument("--tokens", type=int, default=256, help="tokens per request (default 256)")
    p.add_argument("--prompts", type=int, default=4, choices=range(1, len(PROMPTS) + 1), metavar="1..4")
    p.add_argument("--phases", action="store_true", help="also split each mode's rounds into phases (window, "
                   "forward, draws, after), in a second run")
    p.add_argument("--draft-rows", type=int, default=None,
                   help="rows of a block drafter's window, the sampled token included (default: its block size)")
    p.add_argument("--json", help="also write the results to this file")
    p.set_defaults(run=run)
