"""The `tensorfold` command: `generate`, `make-tiny`, `contract`, `serve` and `bench` (`tensorfold-serve` is
`tensorfold serve`)."""
import argparse
import os
import sys
import time

from tensorfold.errors import TensorfoldError


def cmd_generate(args) -> None:
    from tensorfold.api import load
    from tensorfold.drafters import DraftGate, make_drafter
    from tensorfold.engine import Engine, SamplingParams

    started = time.perf_counter()
    model = load(args.model, backend=args.backend)
    drafter = make_drafter(args.drafter, model, args.draft_shape, args.draft_rows)
    print(f"# {model.path}: {model.config.num_hidden_layers} layers, {model.weight_bytes / 2**20:.1f} MiB of "
          f"weights, backend {model.backend.name}, drafter {drafter.name}, loaded in "
          f"{time.perf_counter() - started:.2f} s", file=sys.stderr)
    if args.chat is not None:
        messages = [{"role": "user", "content": args.chat}]
        ids = model.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    else:
        ids = model.tokenizer.encode(args.prompt)
        print(args.prompt, end="", flush=True)
    engine = Engine(model, parallel=1, context=min(len(ids) + args.max_tokens, model.config.max_position_embeddings),
                    drafter=drafter, gate=DraftGate() if args.drafter == "auto" else None)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, min_p=args.min_p, seed=args.seed)
    decoder = model.tokenizer.decoder(skip_special_tokens=True)
    started = time.perf_counter()
    engine.start()
    try:
        request = engine.submit(ids, params)
        for token in request:
            print(decoder.push(token), end="", flush=True)
    finally:
        engine.stop()
    print(decoder.flush())
    elapsed, stats = time.perf_counter() - started, request.stats
    drafted = (f"; {stats.accepted} of {stats.drafted} drafted tokens accepted, "
               f"{(stats.accepted + stats.draft_rounds) / stats.draft_rounds:.2f} tokens per drafted round"
               if stats.draft_rounds else "")
    print(f"# {len(ids)} prompt tokens, {stats.output_tokens} generated in {elapsed:.2f} s, {stats.rounds} rounds"
          f"{drafted}", file=sys.stderr)


def cmd_make_tiny(args) -> None:
    from tensorfold.model.tiny import make_tiny

    config = make_tiny(args.out, seed=args.seed, fmt=args.format)
    print(f"wrote a random {config.num_hidden_layers}-layer Qwen3.5 checkpoint ({args.format}, seed {args.seed}) "
          f"to {args.out}")


def cmd_contract(args) -> int:
    if not args.gpu:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # read once, when numba.cuda is first imported (just below)
    from numba import cuda

    if args.gpu and (os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or not cuda.is_available()):
        raise TensorfoldError("--gpu: no usable CUDA GPU here (or NUMBA_ENABLE_CUDASIM=1 is set)")
    from tensorfold.contract import run_contract

    mode = "gpu" if args.gpu else "sim"
    where = cuda.get_current_device().name if args.gpu else "numba's CUDA simulator"
    print(f"# kernel contract, {mode} shapes, on {where}", flush=True)
    results = run_contract(mode, only=args.only, echo=lambda line: print(line, flush=True))
    return 0 if results and all(r.passed and not r.missed_controls for r in results) else 1


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="tensorfold", description="Qwen3.5 inference, twin by twin.")
    commands = top.add_subparsers(dest="command", required=True)

    gen = commands.add_parser("generate", help="generate text from a prompt or a chat message")
    gen.add_argument("--model", help="checkpoint folder or hub id (default: the embedded model)")
    what = gen.add_mutually_exclusive_group(required=True)
    what.add_argument("--prompt", help="raw text to continue")
    what.add_argument("--chat", help="a user message, rendered with the model's chat template")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--min-p", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--backend", default="auto", choices=("auto", "numpy", "cuda"))
    gen.add_argument("--drafter", default="auto", help="a DFlash block drafter folder, ngram, ngram-tree, none, or "
                     "auto (the model's own drafter/ folder if it has one, else ngram, drafting only while the engine "
                     "measures that it pays); output is the same either way")
    gen.add_argument("--draft-shape", default="chain", choices=("chain", "tree"),
                     help="what a block drafter proposes each round (default chain)")
    gen.add_argument("--draft-rows", type=int, default=None,
                     help="a block drafter's rows per round, root included (default: its block size)")
    gen.set_defaults(run=cmd_generate)

    tiny = commands.add_parser("make-tiny", help="write a small random Qwen3.5 checkpoint")
    tiny.add_argument("out", help="output folder")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--format", default="hf", choices=("hf", "mlx4", "mlx8"))
    tiny.set_defaults(run=cmd_make_tiny)

    contract = commands.add_parser("contract", help="check every kernel against its twin, with planted controls")
    contract.add_argument("--gpu", action="store_true", help="on the GPU at real shapes (default: the simulator)")
    contract.add_argument("--only", help="only the kernels whose name contains this")
    contract.set_defaults(run=cmd_contract)

    from tensorfold.cli.bench.serving import add_parser as add_bench
    add_bench(commands)

    commands.add_parser("serve", help="the OpenAI-compatible server: `tensorfold serve FLAGS` is `tensorfold-serve "
                        "FLAGS`", add_help=False)  # main() hands its arguments over untouched
    return top


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        return serve_main(argv[1:])
    args = parser().parse_args(argv)
    try:
        return args.run(args) or 0
    except TensorfoldError as e:
        print(f"tensorfold: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def serve_main(argv=None) -> int:
    from tensorfold.serve.main import main as serve
    return serve(argv)


if __name__ == "__main__":
    sys.exit(main())
