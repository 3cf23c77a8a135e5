"""`tensorfold bench decode|prefill|all`: the engine's speed in this process, on a random-weight MLX 4-bit
checkpoint with the shapes of a released Qwen3.5 size, beside transformers' model of the same config (the peer).

* decode: greedy, undrafted decode through an `Engine` at 1, 4 and 16 streams (`parallel` = streams, one
  short prompt each); after the warm-up rounds, the tokens of the timed rounds over their time. Beside it, what a
  round would cost if only weight reads counted (the HBM floor: the bytes a round reads over a device-to-device
  copy's bandwidth, measured in the same run) and if only launches counted (the backend calls of a round times the
  host time of one small call); the 4-bit GEMV kernel alone on the largest projections (bytes of codes, scales
  and biases over its time); and the memory a stream takes.
* prefill: a cold prompt (a fresh state, no prompt cache) of each length through `Model.prefill`, in the
  engine's 128-row chunks, to the last row's logits. A length is skipped, and the table says so, when the lengths
  before it project a time above `--max-seconds`.
* the peer: `transformers.Qwen3_5ForCausalLM` with the same config in bf16, random weights, on the same device:
  greedy batch-1 decode in a loop of one-token forwards on its cache (each token id copied to the host, as a
  streaming server does) and cold prefill at the same lengths.

On the cuda backend every wall-clock timing synchronises the backend's stream before the clock starts and
before it stops; kernel and copy timings are taken on the device, between two events.

The checkpoint is written once into a cache folder and reused: its matrices are drawn packed (random 4-bit
codes), which takes seconds where quantizing float weights (`make_tiny`) takes minutes at 2B.
"""
import dataclasses
import functools
import gc
import importlib.metadata
import importlib.util
import inspect
import json
import math
import os
import platform
import shutil
import subprocess
import time
import warnings

import numpy as np

from tensorfold.model.presets import PRESETS

CONFIG_NAMES = (*PRESETS, "tiny")  # "tiny": make_tiny's test config, for a run on the CPU
MLX_GROUP = 64
CODE_STD = math.sqrt((16 ** 2 - 1) / 12)  # the standard deviation of a 4-bit code drawn uniformly from 0 .. 15


def echo(line: str = "") -> None:
    print(line, flush=True)


# --- the checkpoint -------------------------------------------------------------------------------------------

def bench_config(name: str):
    """The ModelConfig of a config name: a released size from presets.py, or "tiny"."""
    from tensorfold.errors import TensorfoldError
    from tensorfold.model.presets import preset
    from tensorfold.model.tiny import TINY_CONFIG
    if name == "tiny":
        return TINY_CONFIG
    try:
        return preset(name)
    except KeyError:
        raise TensorfoldError(f"unknown config {name!r}: choose one of {', '.join(CONFIG_NAMES)}") from None


def default_cache() -> str:
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tensorfold", "bench")


def random_vector(name: str, shape: tuple, rng) -> np.ndarray:
    """A norm weight, conv weight or gate parameter in canonical HF form, drawn as make_tiny draws it."""
    if name.endswith("A_log"):
        return np.log(rng.uniform(1.0, 16.0, shape))
    if name.endswith("dt_bias"):
        return rng.normal(0.0, 1.0, shape)
    if name.endswith("conv1d.weight"):
        return rng.normal(0.0, 0.5, shape)
    if name.endswith("linear_attn.norm.weight"):
        return 1.0 + rng.normal(0.0, 0.3, shape)  # the plain norm: its weight multiplies directly
    return rng.normal(0.0, 0.3, shape)  # a centred norm (the writer adds the 1 for MLX)


def random_affine(shape: tuple, std: float, rng) -> tuple:
    """A random 4-bit MLX matrix as stored (packed uint32 codes, bf16 scales, bf16 biases): eight uniform codes a
    word, one scale for the whole matrix giving weights of standard deviation `std`, and the bias centring them."""
    from tensorfold.numerics.formats import f32_to_bf16
    out_features, in_features = shape
    packed = rng.integers(0, 1 << 32, size=(out_features, in_features // 8), dtype=np.uint32)
    scale = std / CODE_STD
    groups = (out_features, in_features // MLX_GROUP)
    return (packed, np.full(groups, f32_to_bf16(np.float32(scale))),
            np.full(groups, f32_to_bf16(np.float32(-7.5 * scale))))


def write_random_mlx4(folder: str, config, seed: int) -> None:
    """A random MLX 4-bit checkpoint of `config`: make_tiny's tokenizer, the vectors through the writer (config.json
    and model.safetensors), and the matrices drawn packed into matrices.safetensors (the loader reads every
    .safetensors file of a folder). Weights have make_tiny's spread: 1 / sqrt(in), and 1 for the embedding."""
    from tensorfold.model.checkpoint import expected_shapes
    from tensorfold.model.safetensors_io import write_file
    from tensorfold.model.tiny_corpus import TINY_CORPUS
    from tensorfold.model.tokenizer import Tokenizer, train_bpe_tokenizer
    from tensorfold.model.writer import write_checkpoint

    train_bpe_tokenizer([TINY_CORPUS], config.vocab_size - 4, folder)  # the trainer adds 4 tokens of its own
    config = dataclasses.replace(config, eos_token_ids=Tokenizer.from_folder(folder).stop_ids)
    rng = np.random.default_rng(seed)
    shapes = expected_shapes(config)
    vectors, matrices = {}, {}
    started = time.perf_counter()
    for done, (name, shape) in enumerate(shapes.items(), 1):
        if len(shape) == 1 or name.endswith("conv1d.weight"):
            vectors[name] = random_vector(name, shape, rng).astype(np.float32)
        else:
            std = 1.0 if name == "embed_tokens.weight" else 1.0 / math.sqrt(shape[1])
            module = "language_model." + ("lm_head" if name == "lm_head.weight" else "model." + name[:-len(".weight")])
            packed, scales, biases = random_affine(shape, std, rng)
            matrices.update({module + ".weight": ("U32", packed), module + ".scales": ("BF16", scales),
                             module + ".biases": ("BF16", biases)})
        if done % max(1, len(shapes) // 4) == 0:
            echo(f"#   drawn {done}/{len(shapes)} tensors ({time.perf_counter() - started:.1f} s)")
    echo("#   writing the files")
    write_checkpoint(folder, config, vectors, "mlx4", group_size=MLX_GROUP)
    write_file(os.path.join(folder, "matrices.safetensors"), matrices, metadata={"format": "pt"})


def checkpoint_folder(name: str, seed: int, cache: str) -> str:
    """The cached random checkpoint of a config, written first when absent (into a folder renamed once complete,
    so an interrupted write is never reused)."""
    folder = os.path.join(cache, f"qwen3.5-{name}-mlx4-random{seed}")
    if os.path.exists(os.path.join(folder, "config.json")):
        echo(f"# checkpoint {folder} (cached)")
        return folder
    config = bench_config(name)
    partial = folder + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    echo(f"# writing a random {name} checkpoint to {folder}")
    started = time.perf_counter()
    write_random_mlx4(partial, config, seed)
    os.replace(partial, folder)
    echo(f"# written in {time.perf_counter() - started:.1f} s")
    return folder


# --- timing helpers -------------------------------------------------------------------------------------------

def device_free_bytes(backend) -> int | None:
    """Free device memory once the frees numba defers have run (cuda), or None (numpy)."""
    if backend.name != "cuda":
        return None
    gc.collect()
    context = backend.cuda.current_context()
    context.deallocations.clear()
    return context.get_memory_info().free


@functools.cache
def hold_kernel():
    """A one-thread kernel that sleeps for about a number of microseconds (compiled on first use)."""
    from numba import cuda

    @cuda.jit
    def hold(microseconds):
        for _ in range(microseconds):
            cuda.nanosleep(1000)
    return hold


def device_seconds(backend, launch, repeats: int) -> float:
    """Seconds per call of `launch` (which only queues work). On cuda the calls are queued behind a kernel that
    holds the stream, so they run back to back on the device, timed between two events; on numpy, wall time."""
    launch()  # compile and warm
    backend.synchronize()
    if backend.name != "cuda":
        started = time.perf_counter()
        for _ in range(repeats):
            launch()
        return (time.perf_counter() - started) / repeats
    cuda, stream = backend.cuda, backend.stream
    start, end = cuda.event(), cuda.event()
    with cuda.current_context().deallocations.disable(), warnings.catch_warnings():  # a free would wait for the hold
        warnings.simplefilter("ignore")  # numba's low-occupancy warning for the one-thread hold
        hold_kernel()[1, 1, stream](50_000)  # 50 ms: time to queue every launch behind it
        start.record(stream)
        for _ in range(repeats):
            launch()
        end.record(stream)
        end.synchronize()
    return cuda.event_elapsed_time(start, end) / 1000 / repeats


def gemv_bandwidth(backend, name: str, weight, repeats: int) -> dict:
    """The affine GEMV kernel alone on one weight for one row: bytes of codes, scales and biases over its time."""
    x = backend.upload(np.random.default_rng(0).normal(size=(1, weight.in_features)).astype(np.float32))
    if backend.name == "cuda":
        from tensorfold.cuda import gemv
        launch = lambda: gemv.launch_gemv(gemv.gemv_affine_kernel, x, weight.out_features, weight.data,  # noqa
                                          weight.scales, weight.biases, weight.bits, weight.group_size,
                                          stream=backend.stream)
    else:
        launch = lambda: backend.linear(x, weight)  # noqa
    seconds = device_seconds(backend, launch, repeats)
    return {"weight": name, "shape": [weight.out_features, weight.in_features], "bytes": weight.nbytes,
            "seconds": seconds, "bytes_per_s": weight.nbytes / seconds}


def copy_bandwidth(backend, nbytes: int, repeats: int) -> float:
    """Bytes moved per second by a copy of an `nbytes` array on the backend's memory, counting each byte read and
    written (2 * nbytes a copy)."""
    if backend.name == "cuda":
        source = backend.cuda.device_array(nbytes // 4, np.float32, stream=backend.stream)
        target = backend.cuda.device_array(nbytes // 4, np.float32, stream=backend.stream)
        launch = lambda: target.copy_to_device(source, stream=backend.stream)  # noqa
    else:
        source, target = np.ones(nbytes // 4, np.float32), np.empty(nbytes // 4, np.float32)
        launch = lambda: np.copyto(target, source)  # noqa
    return 2 * source.nbytes / device_seconds(backend, launch, repeats)


def op_seconds(backend, repeats: int = 500) -> float:
    """Host time of one small backend call (an add of two one-element arrays, output allocation included): the
    cost of a launch when the work itself is nothing."""
    a, b = backend.upload(np.ones((1, 1), np.float32)), backend.upload(np.ones((1, 1), np.float32))
    backend.add(a, b)
    backend.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        backend.add(a, b)
    seconds = (time.perf_counter() - started) / repeats
    backend.synchronize()
    return seconds


UNCOUNTED = {"side_by_side"}  # backend methods that only arrange where later calls go: no work of their own


class CountingBackend:
    """A backend stand-in that counts the calls the model makes (on cuda, each is a kernel launch or a copy)."""

    def __init__(self, backend):
        self.backend, self.calls = backend, 0

    def __getattr__(self, name):
        attribute = getattr(self.backend, name)
        if not callable(attribute) or name in UNCOUNTED:
            return attribute

        def counted(*args, **kwargs):
            self.calls += 1
            return attribute(*args, **kwargs)
        return counted


def calls_per_round(model, streams: int) -> int:
    """Backend calls in one decode round of `streams` undrafted streams (the round after their prompts)."""
    from tensorfold.engine import Engine, SamplingParams
    net, real = model.net, model.net.ops
    counter = net.ops = CountingBackend(real)  # the caches of streams admitted now call through it too
    try:
        engine = Engine(model, parallel=streams, context=8, graphs=False)  # the eager round's calls
        for i in range(streams):
            engine.submit([i + 1], SamplingParams(max_tokens=4, draft=False, stop_ids=()))
        engine.run_round()
        counter.calls = 0
        engine.run_round()
    finally:
        net.ops = real
    return counter.calls


class TimingBackend(CountingBackend):
    """A backend stand-in that times each call alone: the stream is drained before the call and after it, so a
    call's time is its host work plus its device work."""

    def __init__(self, backend):
        super().__init__(backend)
        self.seconds, self.counts = {}, {}

    def __getattr__(self, name):
        attribute = getattr(self.backend, name)
        if not callable(attribute) or name in UNCOUNTED:
            return attribute

        def timed(*args, **kwargs):
            self.backend.synchronize()
            started = time.perf_counter()
            result = attribute(*args, **kwargs)
            self.backend.synchronize()
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started
            self.counts[name] = self.counts.get(name, 0) + 1
            return result
        return timed


def ops_per_round(model, rounds: int = 5) -> dict:
    """One undrafted stream's decode rounds with every backend call timed alone: per op, its calls and its
    milliseconds a round, and the round so timed (the sum, plus the engine's own host work)."""
    from tensorfold.engine import Engine, SamplingParams
    net, real = model.net, model.net.ops
    timer = net.ops = model.backend = TimingBackend(real)  # the stream's cache calls through it too
    try:
        engine = Engine(model, parallel=1, context=64, graphs=False)  # each op alone: eager, never replayed
        engine.submit([1, 2, 3], SamplingParams(max_tokens=3 + rounds, draft=False, stop_ids=()))
        engine.run_round()  # the prompt
        engine.run_round()
        timer.seconds.clear()
        timer.counts.clear()
        started = time.perf_counter()
        for _ in range(rounds):
            engine.run_round()
        seconds = time.perf_counter() - started
    finally:
        net.ops = model.backend = real
    ops = sorted(({"op": name, "calls": timer.counts[name] / rounds, "ms": 1000 * timer.seconds[name] / rounds}
                  for name in timer.seconds), key=lambda op: -op["ms"])
    return {"rounds": rounds, "ms_per_round": 1000 * seconds / rounds, "ops": ops}


def round_bytes(model) -> int:
    """Weight bytes a decode round reads: every weight, less the embedding table when the head is separate (a
    round reads only its rows)."""
    embedding = model.net.weights["embed_tokens.weight"].nbytes if not model.config.tie_word_embeddings else 0
    return model.weight_bytes - embedding


# --- the measurements -----------------------------------------------------------------------------------------

def decode_rate(model, streams: int, tokens: int, warmup: int, prompt_tokens: int, rng) -> dict:
    """Aggregate greedy decode tok/s of `streams` undrafted streams in one engine, over the rounds after warm-up."""
    from tensorfold.engine import Engine, SamplingParams
    engine = Engine(model, parallel=streams, context=prompt_tokens + warmup + tokens)
    free_before = device_free_bytes(model.backend)
    requests = [engine.submit(rng.integers(0, model.config.vocab_size, prompt_tokens),
                              SamplingParams(max_tokens=warmup + tokens, draft=False, stop_ids=()))
                for _ in range(streams)]
    for _ in range(warmup):  # the first round takes the prompts and gives every stream its first token
        engine.run_round()
    free_after = device_free_bytes(model.backend)
    state_bytes = max(stream.state.nbytes for stream in engine.active)
    model.backend.synchronize()
    started, rounds = time.perf_counter(), 0
    while engine.run_round():
        rounds += 1
    model.backend.synchronize()
    seconds = time.perf_counter() - started
    produced = sum(len(r.output) for r in requests) - streams * warmup
    graphs = engine.graphs
    return {"streams": streams, "tokens": produced, "seconds": seconds, "tok_s": produced / seconds,
            "graph_rounds": {"recorded": graphs.recorded, "replayed": graphs.replayed} if graphs else None,
            "ms_per_round": 1000 * seconds / rounds, "context": engine.context, "stream_bytes": engine.stream_bytes(),
            "state_bytes": state_bytes,
            "device_bytes_per_stream": None if free_before is None else (free_before - free_after) // streams}


def prefill_rate(model, length: int, rng) -> dict:
    """Cold prefill tok/s of a `length`-token prompt: a fresh state through Model.prefill to the last logits."""
    from tensorfold.engine import Engine
    ids = rng.integers(0, model.config.vocab_size, length).tolist()
    free_before = device_free_bytes(model.backend)
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
    """`measure(length)` for each length, shortest first, skipping those projected to take over `max_seconds`."""
    results, done = [], []
    for length in sorted(set(lengths)):
        projected = projected_seconds(done, length)
        if projected is not None and projected > max_seconds:
            reason = f"projected {projected:.0f} s > --max-seconds {max_seconds:g}"
            results.append({"tokens": length, "skipped": reason})
            echo(f"#   {who} prefill {length:,}: skipped, {reason}")
            continue
        result = measure(length)
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
        level = decode_rate(model, streams, args.tokens, args.warmup, args.prompt_tokens, rng)
        level["calls_per_round"] = calls_per_round(model, streams)
        levels.append(level)
        echo(f"#   decode x{streams}: {level['tok_s']:,.1f} tok/s ({level['ms_per_round']:.2f} ms a round)")
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
            "us_per_call": op_us, "ops": breakdown, "gemv": gemvs,
            "floor": {"round_bytes": read, "copy_mib": args.copy_mib, "copy_bytes_per_s": copy,
                      "ms_per_round": floor_ms, "tok_s": 1000 / floor_ms}}


# --- the peer -------------------------------------------------------------------------------------------------

def peer_unavailable(backend_name: str) -> str | None:
    """Why the peer cannot run by default here, or None when it can (torch and transformers with CUDA)."""
    if backend_name != "cuda":
        return "the numpy backend (ask for it with --peer)"
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        return f"{' and '.join(missing)} not installed"
    import torch
    return None if torch.cuda.is_available() else "torch sees no CUDA device"


class Peer:
    """transformers' Qwen3_5ForCausalLM with the same config in bf16, random weights, on `device`."""

    def __init__(self, config, device: str):
        import torch
        import transformers
        transformers.logging.set_verbosity_error()  # its fallback warnings say what `fast_paths` reports
        self.torch, self.device = torch, device
        hf_config = transformers.Qwen3_5TextConfig(**config.to_dict())
        with torch.device(device):
            self.model = transformers.Qwen3_5ForCausalLM._from_config(hf_config, dtype=torch.bfloat16).eval()
        parameters = inspect.signature(self.model.forward).parameters
        self.cache_argument = "cache" if "cache" in parameters else "past_key_values"  # the older name

    def forward(self, ids, cache=None):
        """The last row's logits of `ids` continuing `cache` (None: a fresh one), and the cache."""
        ids = self.torch.tensor([ids], device=self.device)
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{self.cache_argument: cache})
        return out.logits[0, -1], out.past_key_values

    def synchronize(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def decode_rate(self, prompt: list, tokens: int, warmup: int) -> dict:
        """Greedy batch-1 decode: one-token forwards on the cache, each token id copied to the host."""
        with self.torch.inference_mode():
            logits, cache = self.forward(prompt)
            for step in range(warmup + tokens):
                if step == warmup:
                    self.synchronize()
                    started = time.perf_counter()
                logits, cache = self.forward([int(logits.argmax())], cache)
            self.synchronize()
        seconds = time.perf_counter() - started
        return {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds}

    def prefill_rate(self, length: int, rng) -> dict:
        """Cold prefill tok/s of a `length`-token prompt: one forward from a fresh cache to the last logits."""
        ids = rng.integers(0, self.model.config.vocab_size, length).tolist()
        with self.torch.inference_mode():
            self.synchronize()
            started = time.perf_counter()
            try:
                self.forward(ids)
            except self.torch.cuda.OutOfMemoryError:
                self.torch.cuda.empty_cache()
                return {"tokens": length, "skipped": "out of memory"}
            self.synchronize()
        seconds = time.perf_counter() - started
        return {"tokens": length, "seconds": seconds, "tok_s": length / seconds}


def run_peer(config, args, device: str, rng) -> dict:
    """The peer's decode and prefill, as the command asks, and what it runs with."""
    from tensorfold.api import PROMPT_CHUNK
    started = time.perf_counter()
    peer = Peer(config, device)
    echo(f"# peer built in {time.perf_counter() - started:.1f} s")
    result = {"model": "transformers Qwen3_5ForCausalLM, bf16", "device": device,
              "attention": getattr(peer.model.config, "_attn_implementation", None),
              "fast_paths": {"flash-linear-attention": importlib.util.find_spec("fla") is not None,
                             "causal-conv1d": importlib.util.find_spec("causal_conv1d") is not None}}
    if args.bench in ("decode", "all"):
        prompt = rng.integers(0, config.vocab_size, args.prompt_tokens).tolist()
        result["decode"] = peer.decode_rate(prompt, args.tokens, args.warmup)
        echo(f"#   peer decode x1: {result['decode']['tok_s']:,.1f} tok/s")
    if args.bench in ("prefill", "all"):
        peer.prefill_rate(PROMPT_CHUNK + 8, rng)  # warm-up
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
    versions = {"python": platform.python_version()}
    versions.update({name: version(name) for name in ("numpy", "numba", "numba-cuda", "torch", "transformers")})
    if backend.name != "cuda":
        return {"device": f"CPU ({platform.machine()})", "versions": versions}
    device = backend.cuda.get_current_device()
    name = device.name.decode() if isinstance(device.name, bytes) else device.name
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i",
                              str(device.id)], capture_output=True, text=True, timeout=30)
        driver = smi.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        driver = None
    major, minor = backend.cuda.cudadrv.driver.get_version()
    return {"device": name, "driver": driver, "cuda_driver_api": f"{major}.{minor}",
            "compute_capability": ".".join(map(str, device.compute_capability)), "device_pool": backend.pooled,
            "graphs": os.environ.get("TENSORFOLD_GRAPHS", "1") != "0",
            "cached_launch": os.environ.get("TENSORFOLD_CACHED_LAUNCH", "1") != "0",
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
    lines = [f"# tensorfold bench {results['command']}: Qwen3.5-{results['config']} shapes, random MLX 4-bit weights, "
             f"backend {results['backend']}",
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
            replays = (f"; {graphed['replayed']} rounds replayed from {graphed['recorded']} CUDA graph recordings"
                       if graphed else "; CUDA graphs off")
            lines.append(f"decode round, {streams(level['streams'])}: {level['ms_per_round']:.2f} ms measured"
                         f"{replays}; "
                         f"eager launch model {level['calls_per_round']:,} backend calls x "
                         f"{decode['us_per_call']:.1f} us = {level['launch_ms_per_round']:.2f} ms")
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
    from tensorfold.api import PROMPT_CHUNK
    from tensorfold.errors import TensorfoldError

    config = bench_config(args.config)
    if min(args.streams + args.lengths) < 1 or args.tokens < 1 or args.warmup < 1 or args.prompt_tokens < 1:
        raise TensorfoldError("--tokens, --warmup, --prompt-tokens, --streams and --lengths must be positive")
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
        model.prefill(rng.integers(0, config.vocab_size, PROMPT_CHUNK + 8).tolist(), model.net.new_state())  # warm-up
        results["prefill"] = prefill_lengths(lambda n: prefill_rate(model, n, rng), args.lengths, args.max_seconds,
                                             "tensorfold")
        save()
    if want_peer:
        try:
            results["peer"] = run_peer(model.config, args, "cuda" if args.backend == "cuda" else "cpu", rng)
        except Exception as error:  # the peer is a comparison: its failure must not lose the numbers above
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
        p.add_argument("--lengths", type=integers, default=[512, 2048, 16384],
                       help="prefill lengths (default 512,2048,16384)")
        p.add_argument("--max-seconds", type=float, default=120.0,
                       help="skip a prefill length projected to take longer than this")
        p.add_argument("--copy-mib", type=int, default=1024, help="size of the array copied for the HBM floor")
        p.add_argument("--gemv-repeats", type=int, default=50, help="GEMV launches timed together")
        p.set_defaults(run=run)
