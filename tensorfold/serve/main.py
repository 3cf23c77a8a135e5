"""`tensorfold-serve` (also `tensorfold serve`): load a model, plan its memory, and serve it over HTTP."""
import argparse
import logging
import os
import sys
import threading
import time

from tensorfold.errors import TensorfoldError

log = logging.getLogger("tensorfold.serve")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def parser() -> argparse.ArgumentParser:
    from tensorfold.request import PROMPT_CHUNK
    p = argparse.ArgumentParser(prog="tensorfold-serve", description="An OpenAI-compatible server for Qwen3.5 models.")
    p.add_argument("--model", help="checkpoint folder or hub id (default: the embedded tiny-shakespeare model)")
    p.add_argument("--drafter", default="auto",
                   help="a DFlash block drafter checkpoint folder, ngram (chains), ngram-tree (trees), none, or auto: "
                        "the model's own drafter/ folder if it has one, else ngram, drafting only in the rounds where "
                        "the engine has measured that drafting pays (default auto)")
    p.add_argument("--draft-shape", default="chain", choices=("chain", "tree"),
                   help="what a block drafter proposes each round (default chain: faster until trees run whole)")
    p.add_argument("--draft-rows", type=int, default=None,
                   help="rows of a block drafter's window, the sampled token included (default: its block size)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--parallel", type=int, default=4, help="streams decoded together (default 4)")
    p.add_argument("--context", type=int, default=None,
                   help="rows per stream: prompt plus output (default: the model's maximum, at most 32768)")
    p.add_argument("--chunk", type=int, default=PROMPT_CHUNK, help=f"prompt rows per round (default {PROMPT_CHUNK})")
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
    p.add_argument("--allowed-origins", default="",
                   help="comma-separated origins that browsers may call the API from, or * for any (CORS; default: "
                        "none)")
    p.add_argument("--shutdown-grace", type=float, default=30.0,
                   help="seconds that running requests get to finish after SIGTERM or SIGINT; what is still running "
                        "then is cut (default 30)")
    p.add_argument("--log-level", default="info", choices=LOG_LEVELS, help="(default info)")
    p.add_argument("--access-log", action="store_true", help="log every HTTP request (default off)")
    return p


def build(args):
    """Load the model and make the engine and server; refuses when the plan does not fit."""
    from tensorfold.api import load
    from tensorfold.drafters import DraftGate, make_drafter
    from tensorfold.engine import Engine
    from tensorfold.model.cache import KeepPolicy
    from tensorfold.prompt_cache import PromptCache
    from tensorfold.serve.app import Server
    from tensorfold.serve.memory import MemoryPlan

    model = load(args.model, backend=args.backend, progress=True)
    context = args.context or min(model.config.max_position_embeddings, 32768)
    cache = PromptCache(int(args.prompt_cache_gib * 2**30)) if args.prompt_cache_gib > 0 else None
    keep = None if args.keep_late is None else KeepPolicy(late=bool(args.keep_late))
    engine = Engine(model, parallel=args.parallel, chunk=args.chunk, context=context,
                    drafter=make_drafter(args.drafter, model, args.draft_shape, args.draft_rows),
                    max_draft=args.max_draft, prompt_cache=cache, keep=keep,
                    gate=DraftGate() if args.drafter == "auto" else None)
    plan = MemoryPlan.of(engine)
    log.info(f"model    {model.path}")
    drafting = " when it pays" if engine.gate is not None else ""
    log.info(f"backend  {model.backend.name}; drafter {engine.drafter.name}{drafting}; deferred keep "
             f"{'on' if engine.keep.late else 'off'}; prompt cache {args.prompt_cache_gib:g} GiB")
    log.info(f"memory   weights {plan.weights / 2**20:.1f} MiB + {plan.streams} streams x {plan.stream / 2**20:.1f} "
             f"MiB ({context} rows each) = {(plan.weights + plan.caches) / 2**20:.1f} MiB of "
             f"{plan.free / 2**20:.0f} MiB free")
    if not plan.fits:
        raise TensorfoldError(f"{plan.streams} streams of {context} rows need {plan.caches / 2**20:.0f} MiB but only "
                              f"{plan.free / 2**20:.0f} MiB are free: lower --parallel or --context")
    hub_id = args.model and not os.path.isdir(args.model)
    name = args.served_model_name or (args.model if hub_id else os.path.basename(os.path.normpath(model.path)))
    origins = [origin.strip() for origin in args.allowed_origins.split(",") if origin.strip()]
    return Server(engine, name, api_key=args.api_key, max_queue=args.max_queue, allowed_origins=origins)


def check_args(args) -> None:
    """Refuse, before loading anything, flags that would serve other than asked."""
    if args.api_key is not None and not args.api_key.strip():
        raise TensorfoldError("the API key (--api-key or TENSORFOLD_API_KEY) is empty: authentication would be off; "
                              "give a key, or unset it to serve without one")
    if args.shutdown_grace < 0:
        raise TensorfoldError(f"--shutdown-grace must be at least 0, got {args.shutdown_grace:g}")


def uvicorn_server(server, host: str, port: int, grace: float, log_level: str = "warning",
                   access_log: bool = False):
    """A uvicorn server whose first SIGINT or SIGTERM drains `server` (`drain`); a second one exits at once."""
    import uvicorn

    class Draining(uvicorn.Server):
        def handle_exit(self, sig, frame):
            if server.draining:
                return super().handle_exit(sig, frame)
            self._captured_signals.append(sig)
            threading.Thread(target=drain, args=(server, grace, self), name="tensorfold-drain", daemon=True).start()

    return Draining(uvicorn.Config(server.app(), host=host, port=port, log_level=log_level, access_log=access_log,
                                   timeout_graceful_shutdown=5))


def drain(server, grace: float, http) -> None:
    """Answer 503 to new requests while the running ones have `grace` seconds to finish; then cut what is left
    (each cut stream still gets its final chunk and [DONE]), let the answers go out, and stop `http`."""
    server.draining = True
    engine, deadline = server.engine, time.monotonic() + grace
    log.info(f"draining: {server.open_requests} requests get up to {grace:g} s to finish")
    while server.open_requests and time.monotonic() < deadline:
        time.sleep(0.02)
    engine.stop(cancel=True)
    flushed = time.monotonic() + 5
    while server.open_requests and time.monotonic() < flushed:
        time.sleep(0.02)
    http.should_exit = True


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(format="%(message)s", stream=sys.stderr)  # other libraries' loggers keep their warnings
    logging.getLogger("tensorfold").setLevel(args.log_level.upper())
    try:
        check_args(args)
        server = build(args)
    except TensorfoldError as e:
        print(f"tensorfold-serve: error: {e}", file=sys.stderr)
        return 2
    import signal
    log.info(f"serving  {server.name} at http://{args.host}:{args.port}/v1")
    # uvicorn catches SIGINT/SIGTERM (here: to drain) and at its end re-raises the signal to the handler it found:
    # a no-op one lets a drained server exit with status 0.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    uvicorn_server(server, args.host, args.port, args.shutdown_grace, args.log_level, args.access_log).run()
    log.info(f"stopped  after {server.metrics.values['requests_total']} requests")
    return 0
