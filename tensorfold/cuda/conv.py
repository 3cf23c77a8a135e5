"""The causal depthwise convolution of DeltaNet layers, with SiLU: for each row r and channel c,

    out[r, c] = SiLU( sum_j weight[c, j] * inputs[r - K + 1 + j, c] ),  j = 0 .. K - 1

where the inputs before a window's first row come from the stream's tail (its last K - 1 raw inputs).

Mapping (the kernel): one thread per (row, channel); the thread walks j in order with fma32, so the sum is the
same whatever else the round holds.
"""
import numpy as np

from .fmath import fma32, silu32


def causal_conv(inputs, tail, weight):
    """inputs [rows, C] after `tail` [K - 1, C]; weight [C, K]. Returns (out [rows, C], new tail [K - 1, C])."""
    kernel = weight.shape[1]
    history = np.concatenate([tail, inputs]).astype(np.float32)  # row r's window is history[r : r + K]
    rows = inputs.shape[0]
    acc = np.zeros_like(inputs, dtype=np.float32)
    for j in range(kernel):
        acc = fma32.py_func(weight[:, j], history[j:j + rows], acc)
    return silu32.py_func(acc), history[rows:].copy()
