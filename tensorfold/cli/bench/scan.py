"""`tensorfold bench scan`: the Gated DeltaNet scan (tensorfold/cuda/deltanet.py) alone, one window of each row count
at the linear-attention shapes of a Qwen3.5 size (its key and value heads and their dims), on random inputs.

Each block of the scan walks its window's rows one after another, so a window's time grows with its rows: a decode row,
a drafted window of 16 rows and a prompt chunk of 2,048 are each a row count here, and the figure is the time of a call
and of one of its rows. Beside each window it times the keep of all its rows: `deltanet_apply` replaying the window's
log into the state before it, as a stream keeping a drafted chain does. Each window is a chain, its maps (rows' depths
and paths) uploaded once before it is timed, as a model's are. On a GPU the calls run on the cuda backend's stream and
memory pool (their outputs and logs come from the pool, as in a model), timed between events behind a kernel that holds
the stream (`device_seconds`); without one, the twin by wall clock, once.
"""
import functools
import json
import sys

import numpy as np

from tensorfold.cli.bench.checkpoint import CONFIG_NAMES, bench_config
from tensorfold.cli.bench.timing import device_seconds
from tensorfold.numerics import paths


def scan_inputs(rng, rows: int, config) -> tuple:
    """(state, q, k, v, decay, beta) of a window of `rows` rows at `config`'s linear-attention shapes: q and k
    L2-normalised per head, the gates in (0, 1) as the model's are, float32."""
    c = config
    nk, nv, dk, dv = c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim

    def unit(shape):
        x = rng.normal(size=shape)
        return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)

    state = (0.1 * rng.normal(size=(nv, dk, dv))).astype(np.float32)
    v = rng.normal(size=(rows, nv, dv)).astype(np.float32)
    decay = rng.uniform(0.8, 1.0, (rows, nv)).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (rows, nv)).astype(np.float32)
    return state, unit((rows, nk, dk)), unit((rows, nk, dk)), v, decay, beta


def run(args) -> int:
    if min(args.rows) < 1:
        print(f"tensorfold bench scan: --rows must be positive, got {args.rows}", file=sys.stderr)
        return 2
    from tensorfold.backends import make_backend
    from tensorfold.serve.memory import on_gpu
    backend = make_backend("auto")
    gpu = on_gpu(backend)
    config = bench_config(args.config)
    rng = np.random.default_rng(args.seed)
    results = {"config": args.config, "gpu": gpu, "windows": []}
    for rows in args.rows:
        inputs = [backend.upload(a) for a in scan_inputs(rng, rows, config)]
        chain = paths.chain(rows)  # its maps uploaded once, as a model's are for each chunk length
        maps = [backend.upload(paths.depths(chain)), backend.upload(paths.path_slots(chain))]
        repeats = args.repeats if gpu else 1
        seconds = device_seconds(backend, functools.partial(backend.deltanet_scan, *inputs, *maps), repeats)
        log = backend.deltanet_scan(*inputs, *maps)[2]
        path = backend.upload(np.arange(rows, dtype=np.int32))  # every row kept, its indices on the device
        keep = device_seconds(backend, functools.partial(backend.deltanet_apply, inputs[0], log, path), repeats)
        results["windows"].append({"rows": rows, "seconds": seconds, "seconds_per_row": seconds / rows,
                                   "keep_seconds": keep})
        print(f"a window of {rows:5d} rows: {seconds * 1e6:10.1f} us, {seconds / rows * 1e6:8.3f} us a row; "
              f"its keep {keep * 1e6:8.1f} us", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def add_parser(kinds) -> None:
    p = kinds.add_parser("scan", help="the Gated DeltaNet scan alone on windows of several row counts")
    p.add_argument("--config", default="2B", choices=CONFIG_NAMES, help="the Qwen3.5 size (tiny: a test config)")
    p.add_argument("--rows", type=lambda s: [int(r) for r in s.split(",")], default=[1, 16, 2048])
    p.add_argument("--repeats", type=int, default=10, help="calls timed together")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.set_defaults(run=run)
