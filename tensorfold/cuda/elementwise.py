"""Elementwise steps between the larger kernels: the residual add and the two gated products.

    add(a, b)          = a + b                 the residual stream
    silu_mul(g, u)     = SiLU(g) * u           the SwiGLU MLP
    sigmoid_mul(x, g)  = x * sigmoid(g)        the output gate of full attention
    take_last(x, a, b) = x[..., a:b]           a contiguous copy of a slice of the last axis (q | k | v, query | gate)

Mapping (the kernel): one thread per element; each element is computed alone, so there is no order to keep.
"""
import numpy as np

from .fmath import sigmoid32, silu32


def add(a, b):
    return np.add(a, b, dtype=np.float32)


def silu_mul(gate, up):
    return silu32.py_func(gate) * up


def sigmoid_mul(x, gate):
    return x * sigmoid32.py_func(gate)


def take_last(x, start, stop):
    return np.ascontiguousarray(x[..., start:stop])
