"""The checks of rope.py: RoPE alone, and the attention layer's norms and RoPE of q and k in one launch."""
import numpy as np
from numba import cuda

from tensorfold.contract import KernelCheck
from tensorfold.contract.controls import off_by, swap_rows, times
from tensorfold.cuda.rope import norm_rope, norm_rope_kernel, norm_rope_launch, rope, rope_kernel, rope_launch
from tensorfold.device.grid import to_host


def _cases(mode, rng):
    """(rows, heads, head_dim, rotary_dim, theta): queries and keys of the released models, plus odd sizes."""
    if mode == "sim":
        shapes = [(3, 2, 16, 8, 1e7), (2, 1, 8, 8, 1e4)]
    else:
        shapes = [(1, 8, 256, 64, 1e7), (16, 2, 256, 64, 1e7), (128, 8, 256, 64, 1e7), (128, 16, 256, 64, 1e7),
                  (17, 4, 256, 64, 1e7), (300, 4, 32, 8, 1e7), (33, 3, 128, 128, 1e4)]
    cases = []
    for rows, heads, head_dim, rotary_dim, theta in shapes:
        positions = rng.integers(0, 262144, rows)
        positions[:min(rows, 3)] = [0, 1, 4095][:min(rows, 3)]  # the first positions of a stream, and a long one
        cases.append((f"{rows}x{heads}x{head_dim}/R{rotary_dim}",
                      {"x": rng.normal(size=(rows, heads, head_dim)).astype(np.float32), "positions": positions,
                       "rotary_dim": rotary_dim, "theta": theta}))
    return cases


def _launch(x, positions, rotary_dim, theta):
    return to_host(rope_launch(cuda.to_device(x), cuda.to_device(np.asarray(positions, np.int32)), rotary_dim, theta))


def _norm_rope_cases(mode, rng):
    """(rows, heads, kv heads, head_dim, rotary_dim, theta): in the simulator a head wider than the block and one
    all rotated; on GPU the 2B's attention at 1, 16 and 128 rows, the 4B's heads, odd sizes."""
    if mode == "sim":
        shapes = [(3, 2, 1, 16, 8, 1e7), (2, 1, 1, 136, 8, 1e4), (2, 2, 2, 8, 8, 1e4)]
    else:
        shapes = [(1, 8, 2, 256, 64, 1e7), (16, 8, 2, 256, 64, 1e7), (128, 8, 2, 256, 64, 1e7),
                  (16, 16, 4, 256, 64, 1e7), (17, 4, 1, 128, 128, 1e4), (5, 3, 3, 40, 8, 1e7)]
    cases = []
    for rows, heads, kv_heads, hd, rotary_dim, theta in shapes:
        positions = rng.integers(0, 262144, rows)
        positions[:min(rows, 3)] = [0, 1, 4095][:min(rows, 3)]
        cases.append((f"{rows}x{heads}+{kv_heads}x{hd}/R{rotary_dim}", {
            "q_and_gate": rng.normal(size=(rows, heads, 2 * hd)).astype(np.float32),
            "k": rng.normal(size=(rows, kv_heads, hd)).astype(np.float32),
            "q_multiplier": (1 + rng.normal(size=hd) * 0.3).astype(np.float32),
            "k_multiplier": (1 + rng.normal(size=hd) * 0.3).astype(np.float32),
            "eps": 1e-6, "positions": positions, "rotary_dim": rotary_dim, "theta": theta}))
    return cases


def _norm_rope_launch(q_and_gate, k, q_multiplier, k_multiplier, eps, positions, rotary_dim, theta):
    return to_host(norm_rope_launch(*(cuda.to_device(a) for a in (q_and_gate, k, q_multiplier, k_multiplier)), eps,
                                    cuda.to_device(np.asarray(positions, np.int32)), rotary_dim, theta))


def _keys_normed_as_queries(inputs):
    """Planted: the query norm's multiplier applied to the keys."""
    return {**inputs, "k_multiplier": inputs["q_multiplier"]}


CONTRACT = [
    KernelCheck("rope", rope, _launch, _cases,
                {"off-by-one position": off_by("positions"), "two swapped rows": swap_rows("x")},
                kernels=(rope_kernel,)),
    KernelCheck("norm_rope", norm_rope, _norm_rope_launch, _norm_rope_cases,
                {"off-by-one position": off_by("positions"), "two swapped rows": swap_rows("q_and_gate"),
                 "eps off by a factor of ten": times("eps", 10),
                 "the query norm's multiplier for the keys": _keys_normed_as_queries},
                kernels=(norm_rope_kernel,)),
]
