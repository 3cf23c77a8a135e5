"""The causal depthwise convolution of DeltaNet layers, with SiLU: for each row r and channel c,

    out[r, c] = SiLU( sum_j weight[c, j] * inputs[r - K + 1 + j, c] ),  j = 0 .. K - 1

where the inputs before a window's first row come from the stream's tail (its last K - 1 raw inputs).

Mapping (the kernel): one thread per (row, channel); the thread walks j in order with fma32, so the sum is the
same whatever else the round holds. K - 1 more rows of threads copy the new tail, the last K - 1 rows of
[tail; inputs], into a new array (the old tail is still being read while they run).
"""
import numpy as np
from numba import cuda

from ..contract import KernelCheck
from .common import BLOCK, blocks_for, swap_rows, to_host
from .fmath import fma32, silu32, silu32_twin


def causal_conv(inputs, tail, weight):
    """inputs [rows, C] after `tail` [K - 1, C]; weight [C, K]. Returns (out [rows, C], new tail [K - 1, C])."""
    kernel = weight.shape[1]
    history = np.concatenate([tail, inputs]).astype(np.float32)  # row r's window is history[r : r + K]
    rows = inputs.shape[0]
    acc = np.zeros_like(inputs, dtype=np.float32)
    for j in range(kernel):
        acc = fma32.py_func(weight[:, j], history[j:j + rows], acc)
    return silu32_twin(acc), history[rows:].copy()


# --- the kernels --------------------------------------------------------------------------------------------------
# Thread (r, c) of a grid over [rows + K - 1, C]: rows r < rows compute output r from the window history[r : r + K];
# the K - 1 rows after them copy history[r] into the new tail. history = [tail; inputs] is never built: row n of it
# is tail[n] for n < K - 1 and inputs[n - K + 1] after.

@cuda.jit(device=True)
def history_at(inputs, tail, n, c):
    """Row n, channel c of [tail; inputs]."""
    if n < tail.shape[0]:
        return tail[n, c]
    return inputs[n - tail.shape[0], c]


@cuda.jit
def causal_conv_kernel(inputs, tail, weight, out, new_tail):
    i = cuda.grid(1)
    channels = inputs.shape[1]
    r, c = i // channels, i % channels
    rows, kernel = inputs.shape[0], weight.shape[1]
    if r < rows:
        acc = np.float32(0)
        for j in range(kernel):
            acc = fma32(weight[c, j], history_at(inputs, tail, r + j, c), acc)
        out[r, c] = silu32(acc)
    elif r < rows + kernel - 1:
        new_tail[r - rows, c] = history_at(inputs, tail, r, c)


def causal_conv_launch(inputs, tail, weight, stream=0):
    """inputs [rows, C], tail [K - 1, C], weight [C, K] on the device; returns (out, new tail), new arrays."""
    rows, channels = inputs.shape
    kernel = weight.shape[1]
    out = cuda.device_array((rows, channels), np.float32, stream=stream)
    new_tail = cuda.device_array((kernel - 1, channels), np.float32, stream=stream)
    causal_conv_kernel[blocks_for((rows + kernel - 1) * channels), BLOCK, stream](inputs, tail, weight, out, new_tail)
    return out, new_tail


# --- the contract -------------------------------------------------------------------------------------------------

def _cases(mode, rng):
    """(rows, channels): fewer rows than the tail, one row, a window; C = 6144 (0.8B, 2B), 8192 (4B), and odd."""
    if mode == "sim":
        shapes = [(1, 5), (2, 3), (6, 7)]
    else:
        shapes = [(1, 6144), (2, 6144), (16, 6144), (128, 6144), (4, 8192), (64, 8192), (17, 1000)]
    kernel = 4
    return [(f"{rows}x{channels}", {"inputs": rng.normal(size=(rows, channels)).astype(np.float32),
                                     "tail": rng.normal(size=(kernel - 1, channels)).astype(np.float32),
                                     "weight": (rng.normal(size=(channels, kernel)) * 0.5).astype(np.float32)})
            for rows, channels in shapes]


def _tail_one_row_behind(inputs):
    """Planted: the tail the stream had one row earlier (its last row missing, a zero row in front)."""
    tail = inputs["tail"]
    return {**inputs, "tail": np.concatenate([np.zeros_like(tail[:1]), tail[:-1]])}


def _taps_reversed(inputs):
    """Planted: weight[:, 0] applied to the current row (a convolution read the wrong way round)."""
    return {**inputs, "weight": np.ascontiguousarray(inputs["weight"][:, ::-1])}


def _launch(inputs, tail, weight):
    return to_host(causal_conv_launch(cuda.to_device(inputs), cuda.to_device(tail), cuda.to_device(weight)))


CONTRACT = [
    KernelCheck("causal_conv", causal_conv, _launch, _cases,
                {"tail one row behind": _tail_one_row_behind, "two swapped rows": swap_rows("inputs"),
                 "taps reversed": _taps_reversed}),
]
