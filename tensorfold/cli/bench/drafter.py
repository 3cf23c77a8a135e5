"""`tensorfold bench drafter`: what drafting buys, in this process. The same prompts are decoded one stream at a
time without drafts, with the drafter's chains and with its trees; for each, the mean acceptance length (tokens per
drafted round, the model's own token included) and the decode rate (output tokens over the time from the first
token to the last, so the prompt pass is left out). Every drafted output must equal the undrafted one (by token
sha256): a mismatch is reported and fails the run.

By default: the embedded model and its own block drafter (`drafter/` beside its weights), greedy and seeded
sampling (T = 0.8), 256 tokens for each of four prompts from the plays, after one untimed warm-up request per mode
(it compiles the kernels).
"""
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


def decode(model, drafter, prompts, tokens: int, sampling: dict) -> dict:
    """Each prompt alone through an engine with `drafter`: the outputs' hashes, the decode rate and acceptance."""
    from tensorfold.engine import Engine, SamplingParams
    engine = Engine(model, parallel=1, drafter=drafter, context=max(len(p) for p in prompts) + tokens)
    hashes, seconds, output, accepted, draft_rounds, rounds = [], 0.0, 0, 0, 0, 0
    for prompt in prompts:
        request = engine.submit(prompt, SamplingParams(max_tokens=tokens, stop_ids=(), **sampling))
        while engine.run_round():
            pass
        ended = time.perf_counter()
        hashes.append(token_sha256(request.output))
        seconds += ended - request.first_token_at
        output += len(request.output) - 1  # the first token comes with the prompt pass, outside the timing
        accepted, draft_rounds = accepted + request.stats.accepted, draft_rounds + request.stats.draft_rounds
        rounds += request.stats.rounds
    return {"hashes": hashes, "tok_s": output / seconds, "rounds": rounds,
            "tau": (accepted + draft_rounds) / draft_rounds if draft_rounds else None}


def run(args) -> int:
    import tensorfold
    from tensorfold.drafters import Drafter, make_drafter

    model = tensorfold.load(args.model, backend=args.backend)
    name = args.drafter or os.path.join(model.path, "drafter")
    modes = {"none": Drafter(), "chain": make_drafter(name, model, "chain"), "tree": make_drafter(name, model, "tree")}
    prompts = [model.tokenizer.encode(p) for p in PROMPTS[:args.prompts]]
    print(f"# {model.path} on {model.backend.name}; drafter {modes['chain'].name}; {len(prompts)} prompts x "
          f"{args.tokens} tokens, one stream at a time", flush=True)
    results, failed = {}, False
    for name, sampling in SAMPLINGS.items():
        for mode, drafter in modes.items():
            decode(model, drafter, prompts[:1], min(args.tokens, 32), sampling)  # warm-up: compiles the kernels
            result = decode(model, drafter, prompts, args.tokens, sampling)
            results[f"{name} {mode}"] = result
            equal = result["hashes"] == results[f"{name} none"]["hashes"]
            failed |= not equal
            tau = f"{result['tau']:6.2f}" if result["tau"] else "     -"
            print(f"{name:7} {mode:6} decode {result['tok_s']:8.1f} tok/s  tau {tau}  rounds {result['rounds']:5}  "
                  f"{'equal to undrafted' if equal else 'DIFFERS FROM UNDRAFTED'}", flush=True)
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
    p.add_argument("--json", help="also write the results to this file")
    p.set_defaults(run=run)
