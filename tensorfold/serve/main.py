"""`tensorfold-serve` (also `tensorfold serve`): load a model, plan its memory, and serve it over HTTP."""
import argparse
import os
import sys

from tensorfold.errors import TensorfoldError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tensorfold-serve", description="An OpenAI-compatible server for Qwen3.5 models.")
    p.add_argument("--model", help="checkpoint folder or hub id (default: the embedded tiny-shakespeare model)")
    p.add_argument("--drafter", default="auto",
                   help="a DFlash block drafter checkpoint folder, ngram (chains), ngram-tree (trees), none, or auto: "
                        "none, except on a GPU with TENSORFOLD_GRAPHS=0: the model's own drafter/ folder if it has "
                        "one, else ngram (default auto)")
    p.add_argument("--draft-shape", default="chain", choices=("chain", "tree"),
                   help="what a block drafter proposes each round (default chain: faster until trees run whole)")
    p.add_argument("--draft-rows", type=int, default=None,
                   help="rows of a block drafter's window, the sampled token included (default: its block size)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--parallel", type=int, default=4, help="streams decoded together (default 4)")
    p.add_argument("--context", type=int, default=None,
                   help="rows per stream: prompt plus output (default: the model's maximum, at most 32768)")
    p.add_argument("--chunk", type=int, default=128, help="prompt rows per round (default 128)")
    p.add_argument("--max-draft", type=int, default=15, help="drafted rows per round and stream (default 15)")
    p.add_argument("--backend", default="auto", choices=("auto", "numpy", "cuda"))
    p.add_argument("--max-queue", type=int, default=64, help="waiting requests before 429 (default 64)")
    p.add_argument("--keep-late", type=int, choices=(0, 1), default=None,
                   help="deferred DeltaNet keep: 1 on, 0 off (default: TENSORFOLD_KEEP_LATE, else on)")
    p.add_argument("--prompt-cache-gib", type=float, default=1.0,
                   help="host memory for stream states at prompt marks, in GiB (0: off; default 1)")
    p.add_argument("--api-key", default=os.environ.get("TENSORFOLD_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 routes (or TENSORFOLD_API_KEY)")
    p.add_argument("--served-model-name", help="the model id clients send (default: the folder name)")
    return p


def build(args):
    """Load the model and make the engine and server; refuses when the plan does not fit."""
    from tensorfold.api import load
    from tensorfold.drafters import make_drafter
    from tensorfold.engine import Engine
    from tensorfold.model.cache import KeepPolicy
    from tensorfold.prompt_cache import PromptCache
    from tensorfold.serve.app import Server
    from tensorfold.serve.memory import MemoryPlan

    model = load(args.model, backend=args.backend, progress=True)
    context = args.context or min(model.config.max_position_embeddings, 32768)
    cache = PromptCache(int(args.prompt_cache_gib * 2**30), args.chunk) if args.prompt_cache_gib > 0 else None
    keep = None if args.keep_late is None else KeepPolicy(late=bool(args.keep_late))
    engine = Engine(model, parallel=args.parallel, chunk=args.chunk, context=context,
                    drafter=make_drafter(args.drafter, model, args.draft_shape, args.draft_rows),
                    max_draft=args.max_draft, prompt_cache=cache, keep=keep)
    plan = MemoryPlan.of(engine)
    print(f"model    {model.path}", file=sys.stderr)
    print(f"backend  {model.backend.name}; drafter {engine.drafter.name}; deferred keep "
          f"{'on' if engine.keep.late else 'off'}; prompt cache {args.prompt_cache_gib:g} GiB", file=sys.stderr)
    print(f"memory   weights {plan.weights / 2**20:.1f} MiB + {plan.streams} streams x {plan.stream / 2**20:.1f} MiB "
          f"({context} rows each) = {(plan.weights + plan.caches) / 2**20:.1f} MiB of {plan.free / 2**20:.0f} MiB "
          f"free", file=sys.stderr)
    if not plan.fits:
        raise TensorfoldError(f"{plan.streams} streams of {context} rows need {plan.caches / 2**20:.0f} MiB but only "
                              f"{plan.free / 2**20:.0f} MiB are free: lower --parallel or --context")
    hub_id = args.model and not os.path.isdir(args.model)
    name = args.served_model_name or (args.model if hub_id else os.path.basename(os.path.normpath(model.path)))
    return Server(engine, name, api_key=args.api_key, max_queue=args.max_queue)


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        server = build(args)
    except TensorfoldError as e:
        print(f"tensorfold-serve: error: {e}", file=sys.stderr)
        return 2
    import signal

    import uvicorn
    print(f"serving  {server.name} at http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    # uvicorn handles SIGINT/SIGTERM itself (stop accepting, finish open requests, run the app's shutdown) and then
    # re-raises the signal to the handler it found: a no-op one lets a drained server exit with status 0.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    uvicorn.run(server.app(), host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=30)
    print(f"stopped  after {server.metrics.values['requests_total']} requests", file=sys.stderr, flush=True)
    return 0
