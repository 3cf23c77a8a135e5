"""Where a cold prefill of a Qwen3.5 size (the 2B by default) spends its time, on the cuda backend: the whole prompt
at several chunk sizes, then one forward of a chunk with every backend call timed alone (the stream drained before
and after each, so a call's time is its host work plus its device work), then one with each call's device time
alone (an event recorded on the stream before and after it, the stream never drained), and how long the host takes
to issue a chunk against how long the device takes to finish it.

    python3 tools/profile_prefill.py [--config 2B] [--length 2048] [--chunks 512,1024,2048] [--json out.json]

It writes bench's random checkpoint into ~/.cache/tensorfold/bench (or --cache) first, as `tensorfold bench`
does. The figures and what they showed are in docs/performance.rst, "Where the time goes".
"""
import argparse
import json
import time

import numpy as np
from numba import cuda

import tensorfold
import tensorfold.api as api
from tensorfold.cli.bench.checkpoint import CONFIG_NAMES, checkpoint_folder, default_cache
from tensorfold.cli.bench.timing import UNCOUNTED, TimingBackend


def prefill_seconds(model, ids, chunk):
    """Wall time of a cold prefill of `ids` in chunks of `chunk` rows, to the last row's logits on the host."""
    api.PROMPT_CHUNK = chunk  # Model.prefill reads the module's constant at each call
    state = model.net.new_state()
    model.backend.synchronize()
    started = time.perf_counter()
    model.backend.to_host(model.prefill(ids, state))
    return time.perf_counter() - started


def forward_through(model, ids, stand_in):
    """One forward of `ids` from a fresh state with the model's backend calls going through `stand_in`."""
    net, real = model.net, model.net.ops
    net.ops = stand_in
    try:
        net.forward(ids, net.new_state(), "last")
        real.synchronize()
    finally:
        net.ops = real
    return stand_in


def ops_of_chunk(model, ids):
    """One forward of `ids` with every backend call timed alone: (op, calls, ms), slowest first."""
    timer = forward_through(model, ids, TimingBackend(model.net.ops))
    return sorted(((op, timer.counts[op], 1000 * s) for op, s in timer.seconds.items()), key=lambda row: -row[2])


class EventBackend:
    """A backend stand-in that records an event on the stream before and after each call (`spans`): the time between
    a call's two events is its device work, read after the forward. The host must issue ahead of the device (a long
    chunk's does): where it falls behind, a call's span also holds the device's wait for it."""

    def __init__(self, backend):
        self.backend, self.spans = backend, []

    def __getattr__(self, name):
        attribute = getattr(self.backend, name)
        if not callable(attribute) or name in UNCOUNTED:
            return attribute

        def marked(*args, **kwargs):
            start, end = cuda.event(), cuda.event()
            start.record(self.backend.stream)
            result = attribute(*args, **kwargs)
            end.record(self.backend.stream)
            self.spans.append((name, start, end))
            return result
        return marked


def device_ops_of_chunk(model, ids):
    """One forward of `ids` with each backend call's device time (`EventBackend`): (op, calls, ms), slowest first."""
    marker = forward_through(model, ids, EventBackend(model.net.ops))
    totals = {}
    for op, start, end in marker.spans:
        calls, ms = totals.get(op, (0, 0.0))
        totals[op] = (calls + 1, ms + start.elapsed_time(end))
    return sorted(((op, calls, ms) for op, (calls, ms) in totals.items()), key=lambda row: -row[2])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="2B", choices=CONFIG_NAMES, help="the random checkpoint's Qwen3.5 size")
    p.add_argument("--length", type=int, default=2048)
    p.add_argument("--chunks", type=lambda s: [int(c) for c in s.split(",")], default=[512, 1024, 2048])
    p.add_argument("--cache", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    model = tensorfold.load(checkpoint_folder(args.config, 0, args.cache or default_cache()), backend="cuda")
    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.config.vocab_size, args.length).tolist()
    results = {"length": args.length, "prefill": {}, "ops": {}, "device_ops": {}}
    for chunk in args.chunks:
        prefill_seconds(model, ids[:chunk + 8], chunk)  # warm-up: every kernel of this chunk shape compiled
        seconds = min(prefill_seconds(model, ids, chunk) for _ in range(2))
        results["prefill"][chunk] = seconds
        print(f"chunk {chunk:5d}: {args.length} tokens in {seconds * 1000:.1f} ms, {args.length / seconds:,.1f} tok/s")
    for chunk in args.chunks:
        ops = results["ops"][chunk] = ops_of_chunk(model, ids[:chunk])
        print(f"one chunk of {chunk} rows, every call timed alone: {sum(ms for _, _, ms in ops):.1f} ms")
        for op, calls, ms in ops:
            print(f"  {op:24s} {calls:5d} calls {ms:9.2f} ms")
    for chunk in args.chunks:
        ops = results["device_ops"][chunk] = device_ops_of_chunk(model, ids[:chunk])
        print(f"one chunk of {chunk} rows, every call's device time: {sum(ms for _, _, ms in ops):.1f} ms")
        for op, calls, ms in ops:
            print(f"  {op:24s} {calls:5d} calls {ms:9.2f} ms")
    chunk = args.chunks[0]
    state = model.net.new_state()
    model.backend.synchronize()
    started = time.perf_counter()
    model.net.forward(ids[:chunk], state, "last")
    issued = time.perf_counter() - started
    model.backend.synchronize()
    done = time.perf_counter() - started
    results["issued_ms"], results["done_ms"] = 1000 * issued, 1000 * done
    print(f"a chunk of {chunk} rows: the host returns after {issued * 1000:.1f} ms, the device is done after "
          f"{done * 1000:.1f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
