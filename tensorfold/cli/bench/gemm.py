"""`tensorfold bench gemm`: the exact-integer GEMM (tensorfold/cuda/gemm.py) alone, on random MLX affine weights of
every projection of a Qwen3.5 size and its head, at several row counts, beside a device-to-device copy's bandwidth
measured in the same run.

Each shape's weight bytes (codes, scales and biases) over a call's time is its effective bandwidth; 2 * rows *
outputs * K over the time its TOPS-equivalent (a multiply-add per weight and row counted as 2). On a GPU the calls
run on the cuda backend's stream and memory pool, timed between events behind a kernel that holds the stream
(`device_seconds`), so the figure is device time, not the host's launch time; without one, the twin by wall clock.

A model's round reads each weight once, between the others, so every weight comes from device memory. Timing one
weight over and over would read a weight of a few MB from the L2 cache instead, faster than any round can. So on a
GPU each weight is uploaded in as many copies as make `--cold-mib` MiB together (`weight_copies`), and the timed calls
take them in turn: each call reads a copy that the copies read since, and their uploads, have pushed out of the cache.
`--cold-mib 0` times one copy, warm in the cache.
"""
import functools
import itertools
import json

import numpy as np

from tensorfold.cli.bench.checkpoint import CONFIG_NAMES, bench_config
from tensorfold.cli.bench.timing import copy_bandwidth, device_seconds


def projections(config) -> list:
    """(name, outputs, K, parts, gated) of each GEMM a layer makes, its stacked projections as one, and the head."""
    c = config
    key, value = c.linear_num_key_heads * c.linear_key_head_dim, c.linear_num_value_heads * c.linear_value_head_dim
    heads = c.linear_num_value_heads
    attention = c.num_attention_heads * c.head_dim
    if c.is_moe:  # an MoE layer's MLP: the router beside the shared gate, one routed expert, the shared expert
        mlp = [("mlp.gate + shared_expert_gate", c.num_experts + 1, c.hidden_size, (c.num_experts, 1), False),
               ("mlp.experts.gate_up_proj, one expert (gated)", 2 * c.moe_intermediate_size, c.hidden_size, None,
                True),
               ("mlp.experts.down_proj, one expert", c.hidden_size, c.moe_intermediate_size, None, False),
               ("mlp.shared_expert.gate/up_proj (gated)", 2 * c.shared_expert_intermediate_size, c.hidden_size, None,
                True),
               ("mlp.shared_expert.down_proj", c.hidden_size, c.shared_expert_intermediate_size, None, False)]
    else:
        mlp = [("mlp.gate/up_proj (gated)", 2 * c.intermediate_size, c.hidden_size, None, True),
               ("mlp.down_proj", c.hidden_size, c.intermediate_size, None, False)]
    return [("linear_attn.in_proj (qkv, z, b, a)", 2 * key + 2 * value + 2 * heads, c.hidden_size,
             (2 * key + value, value, heads, heads), False),
            ("linear_attn.out_proj", c.hidden_size, value, None, False),
            ("self_attn.q/k/v_proj", 2 * attention + 2 * c.num_key_value_heads * c.head_dim, c.hidden_size,
             (2 * attention, c.num_key_value_heads * c.head_dim, c.num_key_value_heads * c.head_dim), False),
            ("self_attn.o_proj", c.hidden_size, attention, None, False), *mlp,
            ("lm_head", c.vocab_size, c.hidden_size, None, False)]


def weight_copies(nbytes: int, cold_bytes: int) -> int:
    """Copies of a weight of `nbytes` that together take at least `cold_bytes` (one at least)."""
    return max(1, -(-cold_bytes // nbytes))


def run(args) -> int:
    from tensorfold.backends import make_backend
    from tensorfold.contract.gemm import random_affine
    from tensorfold.cuda import gemm, gemm_launch
    from tensorfold.serve.memory import on_gpu
    backend = make_backend("auto")
    gpu = on_gpu(backend)
    rng = np.random.default_rng(args.seed)
    results = {"config": args.config, "bits": args.bits, "group_size": args.group_size, "gpu": gpu, "shapes": []}
    if gpu:
        results["copy_bytes_per_s"] = copy_bandwidth(backend, args.copy_mib << 20, repeats=20)
        print(f"copy: {results['copy_bytes_per_s'] / 1e9:,.0f} GB/s (read + write)", flush=True)
        print(f"each weight timed in copies of {args.cold_mib} MiB together, taken in turn" if args.cold_mib else
              "one copy of each weight, timed over and over (warm in the L2 cache)", flush=True)
    for name, outs, columns, parts, gated in projections(bench_config(args.config)):
        packed, scales, biases = random_affine(rng, outs, columns, args.bits, args.group_size)
        nbytes = packed.nbytes + scales.nbytes + biases.nbytes
        copies = weight_copies(nbytes, args.cold_mib << 20) if gpu else 1
        weights = [[backend.upload(a) for a in (packed, scales, biases)] for _ in range(copies)]
        for rows in args.rows:
            x = backend.upload(rng.normal(size=(rows, columns)).astype(np.float32))
            if gpu:
                turn = itertools.cycle(weights)

                def call():
                    return gemm_launch.launch_gemm(x, outs, *next(turn), args.bits, args.group_size,
                                                   stream=backend.stream, parts=parts, gated=gated)
            else:  # the twin, once: it is the CPU's figure, and a slow one at the head
                call = functools.partial(gemm.gemm_affine, x, *weights[0], args.bits, args.group_size)
            seconds = device_seconds(backend, call, args.repeats if gpu else 1)
            row = {"projection": name, "rows": rows, "outputs": outs, "columns": columns, "bytes": nbytes,
                   "copies": copies, "seconds": seconds, "bytes_per_s": nbytes / seconds,
                   "tops": 2 * rows * outs * columns / seconds / 1e12}
            if gpu:
                row["of_copy"] = row["bytes_per_s"] / results["copy_bytes_per_s"]
            results["shapes"].append(row)
            share = f" ({row['of_copy']:.0%} of copy)" if gpu else ""
            print(f"{name:36s} {outs:6d}x{columns:<5d} rows {rows:4d}: {seconds * 1e6:9.1f} us, "
                  f"{row['bytes_per_s'] / 1e9:7.0f} GB/s{share}, {row['tops']:6.1f} TOPS", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def add_parser(kinds) -> None:
    p = kinds.add_parser("gemm", help="the exact-integer GEMM alone on every projection of a Qwen3.5 size")
    p.add_argument("--config", default="2B", choices=CONFIG_NAMES, help="the Qwen3.5 size (tiny: a test config)")
    p.add_argument("--bits", type=int, default=4, choices=(4, 8))
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--rows", type=lambda s: [int(r) for r in s.split(",")], default=[1, 4, 16, 64, 512])
    p.add_argument("--repeats", type=int, default=20, help="calls timed together")
    p.add_argument("--copy-mib", type=int, default=1024, help="size of the array copied for the bandwidth bar")
    p.add_argument("--cold-mib", type=int, default=256,
                   help="on a GPU, each weight in copies of at least this many MiB together, timed in turn, so that "
                        "every call reads its weight from device memory (0: one copy, warm in the L2 cache)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.set_defaults(run=run)
