"""`tensorfold bench chunk`: a long prompt's time to first token against the other streams' decode, at each prompt
chunk size (the engine's `chunk`, `tensorfold-serve --chunk`), in this process.

A round runs every active stream's window: a prompt chunk of up to `chunk` rows (the engine's prompt rows a round)
beside the other streams' decode rows. A longer chunk takes the prompt in fewer rounds, so its first token comes
sooner, but it makes each of those rounds longer, so every other stream waits longer for its next token. For each
chunk size, `--streams` streams decode (greedy, undrafted, each from a random prompt of `--prompt-tokens`). After
`--warmup` rounds a prompt of `--prompt` tokens arrives, and the clock runs from its submission to the round that
gives its first token. Reported: that time and the rounds it took; the other streams' decode rate over it, and over
as many rounds just before it; and the longest of its rounds, which is the longest any other stream waited for a
token.

Before the timed prompt, one prompt of the same length runs to its first token untimed, so that the kernels of its
chunk's shapes have compiled. On the cuda backend the clock starts after the backend's stream is synchronised, and
every round ends with its tokens on the host.
"""
import json
import time

import numpy as np

from tensorfold.cli.bench.checkpoint import CONFIG_NAMES, bench_config, checkpoint_folder, default_cache
from tensorfold.cli.bench.local import echo, environment, integers


def first_token(engine, ids) -> list:
    """Submit a prompt for one token and run rounds until it has it; each round's wall time, in seconds."""
    from tensorfold.engine import SamplingParams
    request = engine.submit(ids, SamplingParams(max_tokens=1, draft=False, stop_ids=()))
    seconds = []
    while not request.output:
        started = time.perf_counter()
        engine.run_round()
        seconds.append(time.perf_counter() - started)
    return seconds


def chunk_level(model, chunk: int, args, rng) -> dict:
    """The measures of one chunk size (the module's docstring)."""
    from tensorfold.engine import Engine, SamplingParams
    prompt_rounds = -(-args.prompt // chunk)
    before_rounds = max(prompt_rounds, args.warmup)
    # the decode tokens a stream needs to outlast the timing: the warm-up, two prompts and the rounds before the second
    budget = args.warmup + 2 * (prompt_rounds + 1) + before_rounds + 2
    engine = Engine(model, parallel=args.streams + 1, chunk=chunk,
                    context=max(args.prompt + 1, args.prompt_tokens + budget))
    decoders = [engine.submit(rng.integers(0, model.config.vocab_size, args.prompt_tokens),
                              SamplingParams(max_tokens=budget, draft=False, stop_ids=()))
                for _ in range(args.streams)]
    for _ in range(args.warmup):
        engine.run_round()
    first_token(engine, rng.integers(0, model.config.vocab_size, args.prompt).tolist())  # untimed: compiles

    def decoded() -> int:
        return sum(len(request.output) for request in decoders)

    model.backend.synchronize()
    tokens, started = decoded(), time.perf_counter()
    for _ in range(before_rounds):
        engine.run_round()
    before = (decoded() - tokens) / (time.perf_counter() - started)
    tokens, started = decoded(), time.perf_counter()
    rounds = first_token(engine, rng.integers(0, model.config.vocab_size, args.prompt).tolist())
    seconds = time.perf_counter() - started
    assert all(request.finish_reason is None for request in decoders), "a decoding stream ended while timed"
    return {"chunk": chunk, "ttft_s": seconds, "rounds": len(rounds), "longest_round_ms": 1000 * max(rounds),
            "decode_tok_s_during": (decoded() - tokens) / seconds, "decode_tok_s_before": before,
            "before_rounds": before_rounds}


def report(results: dict) -> list:
    """The results as a table, a row a chunk size."""
    lines = [f"# tensorfold bench chunk: Qwen3.5-{results['config']} shapes, random MLX 4-bit weights, backend "
             f"{results['backend']}, on {results['environment']['device']}",
             f"# a prompt of {results['prompt']:,} tokens arriving beside {results['streams']} decoding streams", ""]
    rows = [("chunk", "time to first token", "rounds", "longest round", "others' decode during", "before")]
    for level in results["levels"]:
        rows.append((f"{level['chunk']:,}", f"{1000 * level['ttft_s']:,.1f} ms", str(level["rounds"]),
                     f"{level['longest_round_ms']:,.1f} ms", f"{level['decode_tok_s_during']:,.1f} tok/s",
                     f"{level['decode_tok_s_before']:,.1f} tok/s"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return lines + ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]


def run(args) -> int:
    import tensorfold
    from tensorfold.errors import TensorfoldError

    config = bench_config(args.config)
    if min(args.chunks) < 1 or min(args.streams, args.prompt, args.warmup, args.prompt_tokens) < 1:
        raise TensorfoldError("--chunks, --streams, --prompt, --warmup and --prompt-tokens must be positive")
    if args.prompt + 1 > config.max_position_embeddings:
        raise TensorfoldError(f"a prompt of {args.prompt} tokens exceeds the {args.config} config's "
                              f"max_position_embeddings ({config.max_position_embeddings})")
    rng = np.random.default_rng(args.seed)
    folder = checkpoint_folder(args.config, args.seed, args.cache or default_cache())
    model = tensorfold.load(folder, backend=args.backend)
    results = {"command": "chunk", "config": args.config, "backend": args.backend, "checkpoint": folder,
               "environment": environment(model.backend), "streams": args.streams, "prompt": args.prompt,
               "prompt_tokens": args.prompt_tokens, "warmup": args.warmup, "levels": []}
    for chunk in args.chunks:
        level = chunk_level(model, chunk, args, rng)
        results["levels"].append(level)
        echo(f"#   chunk {chunk:,}: first token after {1000 * level['ttft_s']:,.1f} ms in {level['rounds']} rounds, "
             f"the longest {level['longest_round_ms']:,.1f} ms")
        if args.json:  # written after every chunk size, so that a run cut short keeps what it measured
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)
                f.write("\n")
    echo()
    for line in report(results):
        echo(line)
    return 0


def add_parser(kinds) -> None:
    p = kinds.add_parser("chunk", help="a long prompt's time to first token against the other streams' decode, at "
                                       "each prompt chunk size, in this process")
    p.add_argument("--config", default="2B", choices=CONFIG_NAMES, help="the Qwen3.5 size (tiny: a test config)")
    p.add_argument("--backend", default="cuda", choices=("cuda", "numpy"))
    p.add_argument("--seed", type=int, default=0, help="the random checkpoint's seed")
    p.add_argument("--cache", help=f"folder of the random checkpoints (default {default_cache()})")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument("--chunks", type=integers, default=[128, 256, 512, 1024, 2048],
                   help="prompt rows a round (default 128,256,512,1024,2048)")
    p.add_argument("--prompt", type=int, default=4096, help="tokens of the prompt that arrives (default 4096)")
    p.add_argument("--streams", type=int, default=4, help="streams decoding beside it (default 4)")
    p.add_argument("--warmup", type=int, default=8, help="decode rounds before anything is timed (default 8)")
    p.add_argument("--prompt-tokens", type=int, default=16, help="prompt length of each decoding stream")
    p.set_defaults(run=run)
