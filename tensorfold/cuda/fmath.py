"""Scalar math that rounds the same way in NumPy, in numba's CUDA simulator and on the GPU.

Two things break bit-equality between a NumPy twin and a CUDA kernel:

* NVVM fuses `a * b + c` into one fused multiply-add (one rounding) even with fastmath off, while NumPy rounds the
  product and the sum separately. `fma32` makes the fusion explicit: the product of two float32 values is exact in
  float64, so `float32(float64(a) * float64(b) + float64(c))` rounds the same on every side.
* float32 `exp`, `log`, `tanh` differ by an ulp or two between libdevice and NumPy. Every transcendental here is
  evaluated in float64 and rounded once to float32; the float64 results agree far below float32's resolution, so
  the rounded values agree except where a float64 result sits within an ulp of a float32 rounding boundary (the
  kernel tests measure how often: never, over the inputs the model produces).

Each function is a CUDA device function whose body uses only NumPy casts and ufuncs, so the same body also runs
on NumPy arrays: the twins call `fn.py_func`, the kernels call `fn`. Nothing else here touches `cuda.*`.
"""
import numpy as np
from numba import cuda


@cuda.jit(device=True)
def fma32(a, b, c):
    """a * b + c with one rounding to float32."""
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


@cuda.jit(device=True)
def exp32(x):
    """exp(x) evaluated in float64, rounded to float32."""
    return np.float32(np.exp(np.float64(x)))


@cuda.jit(device=True)
def sigmoid32(x):
    """1 / (1 + exp(-x)) evaluated in float64, rounded to float32."""
    return np.float32(1.0 / (1.0 + np.exp(-np.float64(x))))


@cuda.jit(device=True)
def silu32(x):
    """x * sigmoid(x) evaluated in float64, rounded to float32."""
    return np.float32(np.float64(x) / (1.0 + np.exp(-np.float64(x))))


@cuda.jit(device=True)
def softplus32(x):
    """log(1 + exp(x)) in float64, in the overflow-free form max(x, 0) + log1p(exp(-|x|)), rounded to float32.

    PyTorch returns x itself above 20; there the float64 value is within 1e-9 of x, so it rounds to x as well.
    """
    return np.float32(np.maximum(np.float64(x), 0.0) + np.log1p(np.exp(-np.abs(np.float64(x)))))


def tree_sum(parts):
    """Sum the last axis (a power of two) pairwise, as a shared-memory tree: step s adds slot t + s into slot t."""
    parts = np.array(parts, dtype=np.float32, copy=True)
    width = parts.shape[-1]
    assert width & (width - 1) == 0, "a reduction tree needs a power-of-two width"
    while width > 1:
        width //= 2
        parts[..., :width] += parts[..., width:2 * width]
    return parts[..., 0]


def block_dot(a, b, threads):
    """sum(a * b) over the last axis as a block of `threads` threads computes it.

    Thread t accumulates columns t, t + threads, ... with `fma32`, then the block adds the partial sums in a tree.
    """
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    width = a.shape[-1]
    partial = np.zeros(np.broadcast_shapes(a.shape[:-1], b.shape[:-1]) + (threads,), np.float32)
    for start in range(0, width, threads):
        live = min(threads, width - start)
        partial[..., :live] = fma32.py_func(a[..., start:start + live], b[..., start:start + live], partial[..., :live])
    return tree_sum(partial)
