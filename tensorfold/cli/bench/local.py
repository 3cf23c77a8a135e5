"""`tensorfold bench decode|prefill|all`: the engine's speed in this process, on a random-weight MLX 4-bit
checkpoint with the shapes of a released Qwen3.5 size (checkpoint.py), beside transformers' model of the same
config (the peer, peer.py).

* decode: greedy, undrafted decode through an `Engine` at 1, 4 and 16 streams (`parallel` = streams, one
  short prompt each); after the warm-up rounds, the tokens of the timed rounds over their time (the streams'
  key/value buffers grown first to hold every timed row, so that no timed round makes a recording: a lane keeps
  its grown buffers from request to request, model/replay.py). Then one stream
  whose every round is a drafted chain of `--draft-rows` rows (`FullChains`: guesses that are cheap to make, so
  the round's own cost shows): its time a round beside the undrafted round's. Beside it, what a
  round would cost if only weight reads counted (the HBM floor: the bytes a round reads over a device-to-device
  copy's bandwidth, measured in the same run) and if only launches counted (the backend calls of a round times the
  host time of one small call); the 4-bit GEMV kernel alone on the largest projections (bytes of codes, scales
  and biases over its time); and the memory a stream takes (timing.py measures the parts).
* prefill: a cold prompt (a fresh state, no prompt cache) of each length through `Model.prefill`, in chunks of
  `PROMPT_CHUNK` rows, to the last row's logits, twice, the faster kept: a length's first run also compiles what
  its chunks need beyond the warm-up prompt's (the MoE's grouping at a 2,048-row chunk). A length is skipped, and
  the table says so, when the lengths before it project a time above `--max-seconds`.
* the peer: greedy batch-1 decode and cold prefill at the same lengths.

On the cuda backend every wall-clock timing synchronises the backend's stream before the clock starts and
before it stops.
"""
import importlib.metadata
import json
import os
import platform
import subprocess
import time

import numpy as np

from tensorfold.cli.bench.checkpoint import CONFIG_NAMES, bench_config, checkpoint_folder, default_cache
from tensorfold.cli.bench.peer import Peer, peer_unavailable
from tensorfold.cli.bench.timing import (
    calls_per_round,
    copy_bandwidth,
    gemv_bandwidth,
    op_seconds,
    ops_per_round,
    round_bytes,
)
from tensorfold.drafters.base import Drafter


WARMUP_PROMPT = 520  # tokens of the prefill before the timed ones: every prompt kernel compiles (rows past a round's)


def echo(line: str = "") -> None:
    print(line, flush=True)


def device_free_bytes(backend) -> int | None:
    """Free GPU memory (`free_bytes`), or None off the GPU, where a stream's measured share means nothing."""
    from tensorfold.serve.memory import free_bytes, on_gpu
    return free_bytes(backend) if on_gpu(backend) else None


# --- the measurements -----------------------------------------------------------------------------------------

class FullChains(Drafter):
    """A drafter for timing rounds: every round a full chain of guesses (the last token again), made at no cost."""

    name = "full chains"

    def propose(self, tokens: list, max_rows: int, state=None) -> list:
        return [tokens[-1]] * max_rows


def decode_rate(model, streams: int, tokens: int, warmup: int, prompt_tokens: int, rng, rows: int = 1) -> dict:
    """Aggregate greedy decode tok/s of `streams` streams in one engine, over the rounds after warm-up: undrafted,
    or with `rows` > 1 `tokens` rounds that each draft a chain of that many rows (`FullChains`)."""
    from tensorfold.engine import Engine, SamplingParams
    drafting = {"drafter": FullChains(), "max_draft": rows - 1} if rows > 1 else {}
    budget = (warmup + tokens) * rows  # a drafted round may keep all its rows
    engine = Engine(model, parallel=streams, context=prompt_tokens + budget + rows, **drafting)
    free_before = device_free_bytes(model.backend)
    requests = [engine.submit(rng.integers(0, model.config.vocab_size, prompt_tokens),
                              SamplingParams(max_tokens=budget, draft=rows > 1, stop_ids=()))
                for _ in range(streams)]
    warming = time.perf_counter()
    for n in range(warmup):  # the first round takes the prompts and gives every stream its first token
        engine.run_round()
        if n == 0:  # then room for every row: a grown buffer records its rounds anew (replay.py), here in warm-up
            for stream in engine.active:
                stream.state.reserve(engine.context - stream.state.length)
    model.backend.synchronize()
    warmup_seconds = time.perf_counter() - warming
    free_after = device_free_bytes(model.backend)
    state_bytes = max(stream.state.nbytes for stream in engine.active)
    before = sum(len(r.output) for r in requests)
    recorded = engine.graphs.recorded if engine.graphs else 0
    model.backend.synchronize()
    started, rounds = time.perf_counter(), 0
    while (rounds < tokens or engine.behind is not None) and engine.run_round():  # (and a round ahead's tokens)
        rounds += 1
    model.backend.synchronize()
    seconds = time.perf_counter() - started
    produced = sum(len(r.output) for r in requests) - before
    graphs = engine.graphs
    return {"streams": streams, "rows": rows, "tokens": produced, "seconds": seconds, "tok_s": produced / seconds,
            "warmup_seconds": warmup_seconds,
            "graph_rounds": {"recorded": graphs.recorded, "recorded_while_timed": graphs.recorded - recorded,
                             "replayed": graphs.replayed, "kernels_per_round": graphs.kernels} if graphs else None,
            "ms_per_round": 1000 * seconds / rounds, "context": engine.context, "stream_bytes": engine.stream_bytes(),
            "state_bytes": state_bytes,
            "device_bytes_per_stream": None if free_before is None else (free_before - free_after) // streams}


def prefill_rate(model, length: int, rng) -> dict:
    """Cold prefill tok/s of a `length`-token prompt: a fresh state through Model.prefill to the last logits."""
    from tensorfold.device.collector import settle
    from tensorfold.engine import Engine
    ids = rng.integers(0, model.config.vocab_size, length).tolist()
    free_before = device_free_bytes(model.backend)
    settle()  # as a serving engine has after its recordings: the model's objects out of the collector's scans
    state = model.net.new_state(max_rows=length)
    model.backend.synchronize()
    started = time.perf_counter()
    model.backend.to_host(model.prefill(ids, state))
    model.backend.synchronize()
    seconds = time.perf_counter() - started
    free_after = device_free_bytes(model.backend)
    return {"tokens": length, "seconds": seconds, "tok_s": length / seconds,
            "stream_bytes": Engine(model, parallel=1, context=length).stream_bytes(), "state_bytes": state.nbytes,
            "device_bytes": None if free_before is None else free_before - free_after}


def projected_seconds(done: list, length: int) -> float | None:
    """The time a prefill of `length` would take, from the (length, seconds) already measured: t = a L + b L^2
    through the last two (the matrix products grow linearly, attention quadratically), or the quadratic alone from
    one (an upper bound)."""
    if not done:
        return None
    if len(done) == 1:
        (l1, t1), = done
        return t1 * (length / l1) ** 2
    (l1, t1), (l2, t2) = done[-2:]
    b = max(0.0, (t2 / l2 - t1 / l1) / (l2 - l1))
    a = max(0.0, t2 / l2 - b * l2)
    return a * length + b * length ** 2


def prefill_lengths(measure, lengths: list, max_seconds: float, who: str) -> list:
    """The faster of two `measure(length)` for each length, shortest first, skipping those projected to take over
    `max_seconds`."""
    results, done = [], []
    for length in sorted(set(lengths)):
        projected = projected_seconds(done, length)
        if projected is not None and projected > max_seconds:
            reason = f"projected {projected:.0f} s > --max-seconds {max_seconds:g}"
            results.append({"tokens": length, "skipped": reason})
            echo(f"#   {who} prefill {length:,}: skipped, {reason}")
            continue
        result = measure(length)
        if "skipped" not in result:
            again = measure(length)
            result = again if "skipped" not in again and again["seconds"] < result["seconds"] else result
        results.append(result)
        if "skipped" in result:
            echo(f"#   {who} prefill {length:,}: skipped, {result['skipped']}")
            continue
        done.append((length, result["seconds"]))
        echo(f"#   {who} prefill {length:,}: {result['tok_s']:,.1f} tok/s ({result['seconds']:.2f} s)")
    return results


def run_decode(model, args, rng) -> dict:
    """Decode at each stream count with its launch model, the HBM floor, and the GEMV alone."""
    backend = model.backend
    levels = []
    for streams in args.streams:
        echo(f"#   decode x{streams}: {args.warmup} warm-up rounds (on a GPU the first compile and record its "
             f"kernels), then {args.tokens} timed")
        level = decode_rate(model, streams, args.tokens, args.warmup, args.prompt_tokens, rng)
        level["calls_per_round"] = calls_per_round(model, streams)
        levels.append(level)
        echo(f"#   decode x{streams}: {level['tok_s']:,.1f} tok/s ({level['ms_per_round']:.2f} ms a round; warm-up "
             f"{level['warmup_seconds']:.1f} s)")
    drafted = None
    if args.draft_rows > 1:
        one = decode_rate(model, 1, args.tokens, args.warmup, args.prompt_tokens, rng)
        drafted = decode_rate(model, 1, args.tokens, args.warmup, args.prompt_tokens, rng, rows=args.draft_rows)
        drafted["undrafted_ms_per_round"] = one["ms_per_round"]
        echo(f"#   drafted round of {args.draft_rows} rows, 1 stream: {drafted['ms_per_round']:.2f} ms "
             f"({drafted['ms_per_round'] / one['ms_per_round']:.2f}x the undrafted {one['ms_per_round']:.2f} ms)")
    breakdown = ops_per_round(model)
    op_us = 1e6 * op_seconds(backend)
    for level in levels:
        level["launch_ms_per_round"] = level["calls_per_round"] * op_us / 1000
    read = round_bytes(model)
    copy = copy_bandwidth(backend, args.copy_mib << 20, repeats=5)
    floor_ms = 1000 * read / copy
    weights = model.net.weights
    head = "lm_head.weight" if "lm_head.weight" in weights else "embed_tokens.weight (the tied head)"
    layer_matrices = [n for n in weights if n.startswith("layers.") and getattr(weights[n], "kind", None) == "affine"]
    largest_layer = max(layer_matrices, key=lambda n: weights[n].nbytes)
    gemvs = [gemv_bandwidth(backend, head, model.net.lm_head, args.gemv_repeats),
             gemv_bandwidth(backend, largest_layer, weights[largest_layer], args.gemv_repeats)]
    return {"tokens": args.tokens, "warmup": args.warmup, "prompt_tokens": args.prompt_tokens, "levels": levels,
            "drafted_round": drafted,
            "us_per_call": op_us, "ops": breakdown, "gemv": gemvs,
            "floor": {"round_bytes": read, "copy_mib": args.copy_mib, "copy_bytes_per_s": copy,
                      "ms_per_round": floor_ms, "tok_s": 1000 / floor_ms}}


def run_peer(config, args, device: str, rng) -> dict:
    """The peer's decode and prefill, as the command asks, and what it runs with."""
    started = time.perf_counter()
    peer = Peer(config, device)
    echo(f"# peer built in {time.perf_counter() - started:.1f} s")
    result = {"model": f"transformers {type(peer.model).__name__}, bf16", "device": device,
              "attention": getattr(peer.model.config, "_attn_implementation", None),
              "fast_paths": {"flash-linear-attention": importlib.util.find_spec("fla") is not None,
                             "causal-conv1d": importlib.util.find_spec("causal_conv1d") is not None}}
    if args.bench in ("decode", "all"):
        prompt = rng.integers(0, config.vocab_size, args.prompt_tokens).tolist()
        result["decode"] = peer.decode_rate(prompt, args.tokens, args.warmup)
        echo(f"#   peer decode x1: {result['decode']['tok_s']:,.1f} tok/s")
    if args.bench in ("prefill", "all"):
        peer.prefill_rate(WARMUP_PROMPT, rng)
        result["prefill"] = prefill_lengths(lambda n: peer.prefill_rate(n, rng), args.lengths, args.max_seconds,
                                            "peer")
    return result


# --- the report -----------------------------------------------------------------------------------------------

def version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(backend) -> dict:
    """The card and the software versions."""
    from tensorfold.device import graphs
    from tensorfold.serve.memory import on_gpu
    versions = {"python": platform.python_version()}
    versions.update({name: version(name) for name in ("numpy", "numba", "numba-cuda", "torch", "transformers")})
    if not on_gpu(backend):
        return {"device": f"CPU ({platform.machine()})", "versions": versions}
    device = backend.cuda.get_current_device()
    name = device.name.decode() if isinstance(device.name, bytes) else device.name
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i",
                              str(device.id)], check=False, capture_output=True, text=True, timeout=30)
        driver = smi.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        driver = None
    major, minor = backend.cuda.cudadrv.driver.get_version()
    return {"device": name, "driver": driver, "cuda_driver_api": f"{major}.{minor}",
            "compute_capability": ".".join(map(str, device.compute_capability)), "device_pool": backend.pooled,
            "graphs": os.environ.get("TENSORFOLD_GRAPHS", "1") != "0",
            "cached_launch": os.environ.get("TENSORFOLD_CACHED_LAUNCH", "1") != "0",
            "overlapped_launches": graphs.OVERLAP,  # what the kernels were compiled with
            "versions": versions}


def rate(entry) -> str:
    if entry is None:
        return "-"
    return f"skipped: {entry['skipped']}" if "skipped" in entry else f"{entry['tok_s']:,.1f}"


def ratio(ours, theirs) -> str:
    if not ours or not theirs or "skipped" in ours or "skipped" in theirs:
        return "-"
    return f"{ours['tok_s'] / theirs['tok_s']:.2f}"


def mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:,.1f} MiB"


def streams(n: int) -> str:
    return f"{n} stream" + ("s" if n > 1 else "")


def report(results: dict) -> list:
    """The results as a readable table and notes."""
    env, versions = results["environment"], results["environment"]["versions"]
    lines = [(f"# tensorfold bench {results['command']}: Qwen3.5-{results['config']} shapes, random MLX 4-bit "
              f"weights, backend {results['backend']}"),
             f"# {env['device']}" + (f", driver {env['driver']} (CUDA {env['cuda_driver_api']})"
                                     if "driver" in env else ""),
             "# " + ", ".join(f"{k} {v}" for k, v in versions.items() if v),
             f"# weights: {mib(results['weight_bytes'])} (4-bit codes packed; scales and biases in float32)"]
    peer = results["peer"]
    if "skipped" in peer:
        lines.append(f"# peer: not run ({peer['skipped']})")
    else:
        paths = ", ".join(f"{k} {'present' if v else 'absent'}" for k, v in peer["fast_paths"].items())
        lines.append(f"# peer: {peer['model']} on {peer['device']}, attention {peer['attention']}; fast paths: {paths}")
    rows = [("measure", "tensorfold", "peer", "ours/peer")]
    decode, prefill = results.get("decode"), results.get("prefill")
    if decode:
        for level in decode["levels"]:
            theirs = peer.get("decode") if level["streams"] == 1 else None
            label = f"decode, {streams(level['streams'])} ({'aggregate ' if level['streams'] > 1 else ''}tok/s)"
            rows.append((label, rate(level), rate(theirs), ratio(level, theirs)))
    if prefill:
        theirs_by_length = {p["tokens"]: p for p in peer.get("prefill", [])}
        for entry in prefill:
            theirs = theirs_by_length.get(entry["tokens"])
            rows.append((f"cold prefill, {entry['tokens']:,} tokens (tok/s)", rate(entry), rate(theirs),
                         ratio(entry, theirs)))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines.append("")
    lines += ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
              for row in rows]
    if decode:
        floor = decode["floor"]
        lines.append("")
        lines.append(f"HBM floor: {mib(floor['round_bytes'])} read at {floor['copy_bytes_per_s'] / 1e9:,.0f} GB/s "
                     f"(copy) = {floor['ms_per_round']:.3f} ms a round ({floor['tok_s']:,.0f} tok/s for 1 stream)")
        for level in decode["levels"]:
            graphed = level.get("graph_rounds")
            replays = (f"; {graphed['replayed']} rounds replayed from {graphed['recorded']} CUDA graph recordings, "
                       f"{graphed['kernels_per_round']:,} kernels a round" if graphed else "; CUDA graphs off")
            lines.append(f"decode round, {streams(level['streams'])}: {level['ms_per_round']:.2f} ms measured"
                         f"{replays}; "
                         f"eager launch model {level['calls_per_round']:,} backend calls x "
                         f"{decode['us_per_call']:.1f} us = {level['launch_ms_per_round']:.2f} ms")
        drafted = decode.get("drafted_round")
        if drafted:
            lines.append(f"drafted round, 1 stream, a chain of {drafted['rows']} rows every round: "
                         f"{drafted['ms_per_round']:.2f} ms measured, "
                         f"{drafted['ms_per_round'] / drafted['undrafted_ms_per_round']:.2f}x the undrafted round's "
                         f"{drafted['undrafted_ms_per_round']:.2f} ms in the same run")
        ops = decode["ops"]
        lines.append(f"decode round, 1 stream, each backend call timed alone (synchronised): "
                     f"{ops['ms_per_round']:.2f} ms; the calls: " + ", ".join(
                         f"{op['op']} {op['ms']:.2f} ms ({op['calls']:g})" for op in ops["ops"]))
        for g in decode["gemv"]:
            lines.append(f"4-bit GEMV, 1 row, {g['weight']} {g['shape'][0]}x{g['shape'][1]}: "
                         f"{1e6 * g['seconds']:,.1f} us, {g['bytes_per_s'] / 1e9:,.1f} GB/s of {mib(g['bytes'])}")
        for level in decode["levels"]:
            lines.append(f"memory per stream, {streams(level['streams'])} at {level['context']} rows: "
                         f"{mib(level['stream_bytes'])} (Engine.stream_bytes), {mib(level['state_bytes'])} "
                         f"allocated, {mib(level['device_bytes_per_stream'])} measured on the device")
    if prefill:
        for entry in prefill:
            if "skipped" not in entry:
                lines.append(f"memory, one stream after {entry['tokens']:,} tokens: {mib(entry['stream_bytes'])} "
                             f"(Engine.stream_bytes), {mib(entry['state_bytes'])} allocated, "
                             f"{mib(entry['device_bytes'])} measured on the device")
    return lines


def run(args) -> int:
    import tensorfold
    from tensorfold.errors import TensorfoldError
    from tensorfold.model.replay import MAX_ROWS

    config = bench_config(args.config)
    if min(args.streams + args.lengths) < 1 or args.tokens < 1 or args.warmup < 1 or args.prompt_tokens < 1:
        raise TensorfoldError("--tokens, --warmup, --prompt-tokens, --streams and --lengths must be positive")
    if not 1 <= args.draft_rows <= MAX_ROWS:
        raise TensorfoldError(f"--draft-rows must be between 1 and {MAX_ROWS} (a replayed window's rows)")
    decoding, prefilling = args.bench in ("decode", "all"), args.bench in ("prefill", "all")
    contexts = (args.lengths if prefilling else []) + ([args.prompt_tokens + args.warmup + args.tokens]
                                                       if decoding else [])
    if max(contexts) > config.max_position_embeddings:
        raise TensorfoldError(f"{max(contexts)} tokens exceed the {args.config} config's max_position_embeddings "
                              f"({config.max_position_embeddings})")
    want_peer = args.peer if args.peer is not None else peer_unavailable(args.backend) is None
    rng = np.random.default_rng(args.seed)
    folder = checkpoint_folder(args.config, args.seed, args.cache or default_cache())
    started = time.perf_counter()
    model = tensorfold.load(folder, backend=args.backend)
    echo(f"# loaded in {time.perf_counter() - started:.1f} s")
    results = {"command": args.bench, "config": args.config, "backend": args.backend, "checkpoint": folder,
               "weight_bytes": model.weight_bytes, "environment": environment(model.backend)}
    echo(f"# on {results['environment']['device']}")

    def save() -> None:
        """Write the JSON so far, so that a run cut short keeps what it measured."""
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)
                f.write("\n")

    if decoding:
        results["decode"] = run_decode(model, args, rng)
        save()
    if prefilling:
        model.prefill(rng.integers(0, config.vocab_size, WARMUP_PROMPT).tolist(), model.net.new_state())
        results["prefill"] = prefill_lengths(lambda n: prefill_rate(model, n, rng), args.lengths, args.max_seconds,
                                             "tensorfold")
        save()
    if want_peer:
        try:
            results["peer"] = run_peer(model.config, args, "cuda" if args.backend == "cuda" else "cpu", rng)
        except Exception as error:  # noqa: BLE001 (the peer is a comparison: its failure must not lose the rest)
            results["peer"] = {"skipped": f"failed ({type(error).__name__}: {error})"}
    else:
        results["peer"] = {"skipped": "--no-peer" if args.peer is False else peer_unavailable(args.backend)}
    save()
    echo()
    for line in report(results):
        echo(line)
    return 0


def integers(text: str) -> list:
    return [int(x.replace("_", "")) for x in text.split(",")]


def add_parsers(kinds) -> None:
    """`bench decode`, `bench prefill` and `bench all` under the `bench` command's subparsers."""
    for name, help_text in (("decode", "in-process decode speed on a random checkpoint of a Qwen3.5 size"),
                            ("prefill", "in-process cold prefill speed on a random checkpoint of a Qwen3.5 size"),
                            ("all", "decode and prefill, with the peer")):
        p = kinds.add_parser(name, help=help_text)
        p.add_argument("--config", default="2B", choices=CONFIG_NAMES, help="the Qwen3.5 size (tiny: a test config)")
        p.add_argument("--backend", default="cuda", choices=("cuda", "numpy"))
        p.add_argument("--seed", type=int, default=0, help="the random checkpoint's seed")
        p.add_argument("--cache", help=f"folder of the random checkpoints (default {default_cache()})")
        p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
        p.add_argument("--peer", action="store_true", default=None,
                       help="run transformers' model beside (default: when torch and transformers see CUDA)")
        p.add_argument("--no-peer", dest="peer", action="store_false", default=None)
        p.add_argument("--tokens", type=int, default=64, help="timed decode tokens a stream")
        p.add_argument("--warmup", type=int, default=8, help="decode rounds before the clock starts")
        p.add_argument("--prompt-tokens", type=int, default=16, help="prompt length of each decode stream")
        p.add_argument("--streams", type=integers, default=[1, 4, 16], help="decode stream counts (default 1,4,16)")
        p.add_argument("--draft-rows", type=int, default=16,
                       help="rows of the drafted chain whose round is timed beside an undrafted one (default 16; "
                            "1: skip it)")
        p.add_argument("--lengths", type=integers, default=[512, 2048, 16384],
                       help="prefill lengths (default 512,2048,16384)")
        p.add_argument("--max-seconds", type=float, default=120.0,
                       help="skip a prefill length projected to take longer than this")
        p.add_argument("--copy-mib", type=int, default=1024, help="size of the array copied for the HBM floor")
        p.add_argument("--gemv-repeats", type=int, default=50, help="GEMV launches timed together")
        p.set_defaults(run=run)
