"""`tensorfold bench experts`: an MoE size's routed experts alone (tensorfold/cuda/experts.py), one sparse layer's
`ops.routed_experts` (the pairs' grouping, x's quantizes and the two grouped GEMMs) on random MLX affine weights of
every expert, for rows that pick their experts at random, at several row counts.

Each row takes k distinct experts, as the router's top k does, and the shared expert where the model folds it into
the stacks (its width the routed experts': the 35B-A3B's). A call reads the experts its rows touched (at sixteen rows
of the 35B-A3B about a hundred of 256), so the figure is a call's time, those experts' bytes (codes, scales and biases
of their gate/up and down) over that time, and that as a share of a copy's bandwidth measured in the same run. On a
GPU each row count is timed over `--routings` routings taken in turn, so that a call reads experts the calls just
before it did not (one routing of a few rows touches a few MB, which the L2 cache would hold); the calls run on the
cuda backend's stream and memory pool, timed between events behind a kernel that holds the stream
(`device_seconds`). Without a GPU, the twin by wall clock, once.
"""
import itertools
import json
import sys

import numpy as np

from tensorfold.cli.bench.timing import copy_bandwidth, device_seconds


def moe_configs() -> dict:
    """The MoE sizes of presets.py by name, and "tiny-moe" (make_tiny's MoE test config, for a run on the CPU)."""
    from tensorfold.model.presets import PRESETS, preset
    from tensorfold.model.tiny import TINY_MOE_CONFIG
    return {**{name: preset(name) for name in PRESETS if preset(name).is_moe}, "tiny-moe": TINY_MOE_CONFIG}


def expert_stacks(rng, config, bits: int, group_size: int) -> tuple:
    """(gate_up, down, shared): every expert's weights stacked as the model uploads them (model/moe.py's Experts),
    random MLX affine Linears on the host, gate_up [E * 2 I, hidden] and down [E * hidden, I], with the shared expert
    as the stacks' last where its width is the routed experts' (`shared`)."""
    from tensorfold.contract.gemm import random_affine
    from tensorfold.model.checkpoint import Linear
    width, hidden = config.moe_intermediate_size, config.hidden_size
    shared = config.shared_expert_intermediate_size == width
    count = config.num_experts + shared

    def linear(outs, columns):
        return Linear("affine", outs, columns, *random_affine(rng, outs, columns, bits, group_size), bits, group_size)
    return linear(count * 2 * width, hidden), linear(count * hidden, width), shared


def random_routing(rng, rows: int, experts: int, k: int) -> np.ndarray:
    """ids int32 [rows, k]: each row's k distinct experts, drawn uniformly."""
    return np.stack([rng.permutation(experts)[:k] for _ in range(rows)]).astype(np.int32)


def touched(ids, shared: bool) -> int:
    """The experts a call reads: the distinct ids, and the shared expert where it is folded in."""
    return len(np.unique(ids)) + shared


def run(args) -> int:
    configs = moe_configs()
    if args.config not in configs:
        print(f"tensorfold bench experts: {args.config!r} is not an MoE size: choose one of {', '.join(configs)}",
              file=sys.stderr)
        return 2
    if min(args.rows) < 1 or args.routings < 1 or args.repeats < 1:
        print(f"tensorfold bench experts: --rows, --routings and --repeats must be positive, got {args.rows}, "
              f"{args.routings}, {args.repeats}", file=sys.stderr)
        return 2
    from tensorfold.backends import make_backend
    from tensorfold.model.moe import Experts
    from tensorfold.serve.memory import on_gpu
    backend = make_backend("auto")
    gpu = on_gpu(backend)
    config = configs[args.config]
    rng = np.random.default_rng(args.seed)
    results = {"config": args.config, "bits": args.bits, "group_size": args.group_size, "gpu": gpu, "shapes": []}
    if gpu:
        results["copy_bytes_per_s"] = copy_bandwidth(backend, args.copy_mib << 20, repeats=20)
        print(f"copy: {results['copy_bytes_per_s'] / 1e9:,.0f} GB/s (read + write)", flush=True)
    gate_up, down, shared = expert_stacks(rng, config, args.bits, args.group_size)
    count = config.num_experts + shared
    expert_bytes = (gate_up.nbytes + down.nbytes) / count
    experts = Experts.upload(gate_up, down, count, backend.upload, shared)
    for rows in args.rows:
        routings = [random_routing(rng, rows, config.num_experts, config.num_experts_per_tok)
                    for _ in range(args.routings if gpu else 1)]
        inputs = [(backend.upload(rng.normal(size=(rows, config.hidden_size)).astype(np.float32)),
                   backend.upload(ids)) for ids in routings]
        turn = itertools.cycle(inputs)

        def call():
            backend.routed_experts(*next(turn), experts)
        seconds = device_seconds(backend, call, args.repeats if gpu else 1)
        read = float(np.mean([touched(ids, shared) for ids in routings]))
        row = {"rows": rows, "pairs": rows * (config.num_experts_per_tok + shared), "experts_read": read,
               "bytes": read * expert_bytes, "seconds": seconds, "bytes_per_s": read * expert_bytes / seconds}
        share = ""
        if gpu:
            row["of_copy"] = row["bytes_per_s"] / results["copy_bytes_per_s"]
            share = f" ({row['of_copy']:.0%} of copy)"
        results["shapes"].append(row)
        print(f"rows {rows:5d}: {row['pairs']:6d} pairs on {read:6.1f} experts ({row['bytes'] / 1e6:8.1f} MB): "
              f"{seconds * 1e6:9.1f} us, {row['bytes_per_s'] / 1e9:7.0f} GB/s{share}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def add_parser(kinds) -> None:
    p = kinds.add_parser("experts", help="an MoE size's routed experts alone (the grouped exact GEMMs of one layer)")
    p.add_argument("--config", default="35B-A3B", help="an MoE size of presets.py, or tiny-moe (a test config)")
    p.add_argument("--bits", type=int, default=4, choices=(4, 8))
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--rows", type=lambda s: [int(r) for r in s.split(",")], default=[1, 16, 512],
                   help="rows routed a call (default 1,16,512)")
    p.add_argument("--repeats", type=int, default=20, help="calls timed together")
    p.add_argument("--routings", type=int, default=16,
                   help="on a GPU, random routings of each row count taken in turn, so that a call reads experts the "
                        "calls just before it did not")
    p.add_argument("--copy-mib", type=int, default=1024, help="size of the array copied for the bandwidth bar")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.set_defaults(run=run)
