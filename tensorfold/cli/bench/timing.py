"""Device timings and backend-call counts for `tensorfold bench decode`: a call's time on the device, the HBM
floor's copy bandwidth, the 4-bit GEMV alone, the host time of one small call, and the calls (counted or each timed
alone) that one decode round makes.

On a GPU a kernel or copy is timed on the device, between two events, queued behind a kernel that holds the
stream until the host has queued every call (checked each time); elsewhere (numpy, numba's simulator), by wall
clock.
"""
import functools
import time
import warnings

import numpy as np


HOLD_MICROSECONDS = 50_000  # the first hold asked for; a hold the host outlasted is asked for again, longer
HOLD_TRIES = 4


@functools.cache
def hold_kernel():
    """A one-thread kernel that sleeps for about a number of microseconds (compiled on first use): `nanosleep` sleeps
    anything from none to twice what it asks, so the caller checks how long it held (`device_seconds`)."""
    from numba import cuda

    @cuda.jit
    def hold(microseconds):
        for _ in range(microseconds):
            cuda.nanosleep(1000)
    return hold


def device_seconds(backend, launch, repeats: int) -> float:
    """Seconds per call of `launch` (which only queues work). On a GPU the calls are queued behind a kernel that
    holds the stream, so they run back to back on the device, timed between two events; elsewhere, wall time. A hold
    that ended before the host had queued every call (its time between events is shorter than the host's queueing)
    would have timed the host's queueing too, so the run is made again behind a hold of twice the queueing."""
    from tensorfold.serve.memory import on_gpu
    launch()  # compile and warm
    backend.synchronize()
    if not on_gpu(backend):
        started = time.perf_counter()
        for _ in range(repeats):
            launch()
        return (time.perf_counter() - started) / repeats
    cuda, stream = backend.cuda, backend.stream
    held, start, end = cuda.event(), cuda.event(), cuda.event()
    hold = HOLD_MICROSECONDS
    for _ in range(HOLD_TRIES):
        with cuda.current_context().deallocations.disable(), warnings.catch_warnings():  # a free would wait for it
            warnings.simplefilter("ignore")  # numba's low-occupancy warning for the one-thread hold
            held.record(stream)
            hold_kernel()[1, 1, stream](hold)
            start.record(stream)
            queueing = time.perf_counter()
            for _ in range(repeats):
                launch()
            queueing = time.perf_counter() - queueing
            end.record(stream)
            end.synchronize()
        if cuda.event_elapsed_time(held, start) / 1000 > queueing:
            return cuda.event_elapsed_time(start, end) / 1000 / repeats
        hold = max(2 * hold, int(2e6 * queueing))
    raise RuntimeError(f"timing: the host took {queueing * 1e3:.1f} ms to queue {repeats} calls, longer than every "
                       f"hold of the stream ({HOLD_TRIES} tries): ask for fewer repeats")


def gemv_bandwidth(backend, name: str, weight, repeats: int) -> dict:
    """The backend's GEMV alone on one weight for one row: bytes of codes, scales and biases over its time."""
    x = backend.upload(np.random.default_rng(0).normal(size=(1, weight.in_features)).astype(np.float32))

    def launch():
        backend.linear(x, weight)
    seconds = device_seconds(backend, launch, repeats)
    return {"weight": name, "shape": [weight.out_features, weight.in_features], "bytes": weight.nbytes,
            "seconds": seconds, "bytes_per_s": weight.nbytes / seconds}


def copy_bandwidth(backend, nbytes: int, repeats: int) -> float:
    """Bytes moved per second by a copy of an `nbytes` array on the backend's memory, counting each byte read and
    written (2 * nbytes a copy)."""
    from tensorfold.serve.memory import on_gpu
    if on_gpu(backend):
        source = backend.cuda.device_array(nbytes // 4, np.float32, stream=backend.stream)
        target = backend.cuda.device_array(nbytes // 4, np.float32, stream=backend.stream)

        def launch():
            target.copy_to_device(source, stream=backend.stream)
    else:
        source, target = np.ones(nbytes // 4, np.float32), np.empty(nbytes // 4, np.float32)

        def launch():
            np.copyto(target, source)
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
    """Weight bytes a one-stream decode round reads: every weight, less the embedding table when the head is separate
    (a round reads only its rows), and of an MoE layer's routed experts only the num_experts_per_tok its row
    chose."""
    c, weights = model.config, model.net.weights
    embedding = weights["embed_tokens.weight"].nbytes if not c.tie_word_embeddings else 0
    experts = sum(w.nbytes for name, w in weights.items() if ".experts." in name)
    unread = experts - experts * c.num_experts_per_tok // c.num_experts if c.is_moe else 0
    return model.weight_bytes - embedding - unread
