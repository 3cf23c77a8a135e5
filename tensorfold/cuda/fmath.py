"""Scalar math that rounds the same way in NumPy, in numba's CUDA simulator and on the GPU.

Two things break bit-equality between a NumPy twin and a CUDA kernel:

* NVVM fuses `a * b + c` into one fused multiply-add (one rounding) even with fastmath off, while NumPy rounds the
  product and the sum separately. `fma32` makes the fusion explicit: the product of two float32 values is exact in
  float64, so `float32(float64(a) * float64(b) + float64(c))` rounds the same on every side.
* float32 `exp`, `log`, `tanh` differ by an ulp or two between libdevice and NumPy. Every transcendental here is
  evaluated in float64 and rounded once to float32; the float64 results agree far below float32's resolution, so
  the rounded values agree except in the rare case where a float64 result sits on a float32 rounding boundary.

Every function works on NumPy scalars and arrays alike.
"""
import numpy as np

f32 = np.float32
f64 = np.float64


def _round(x64):
    """Round a float64 result to float32, keeping scalars scalar."""
    return x64.astype(f32) if x64.ndim else f32(x64)


def fma32(a, b, c):
    """a * b + c with one rounding to float32."""
    return _round(np.asarray(a, f64) * np.asarray(b, f64) + np.asarray(c, f64))


def exp32(x):
    """exp(x) evaluated in float64, rounded to float32."""
    return _round(np.exp(np.asarray(x, f64)))


def sigmoid32(x):
    """1 / (1 + exp(-x)) evaluated in float64, rounded to float32."""
    return _round(1.0 / (1.0 + np.exp(-np.asarray(x, f64))))


def silu32(x):
    """x * sigmoid(x) evaluated in float64, rounded to float32."""
    x64 = np.asarray(x, f64)
    return _round(x64 / (1.0 + np.exp(-x64)))


def softplus32(x):
    """log(1 + exp(x)) in float64, rounded to float32; x itself above 20, as PyTorch does."""
    x64 = np.asarray(x, f64)
    return _round(np.where(x64 > 20.0, x64, np.log1p(np.exp(np.minimum(x64, 20.0)))))


def tree_sum(parts):
    """Sum the last axis (a power of two) pairwise, as a shared-memory tree: step s adds slot t + s into slot t."""
    parts = np.array(parts, dtype=f32, copy=True)
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
    a = np.asarray(a, f32)
    b = np.asarray(b, f32)
    width = a.shape[-1]
    partial = np.zeros(np.broadcast_shapes(a.shape[:-1], b.shape[:-1]) + (threads,), f32)
    for start in range(0, width, threads):
        live = min(threads, width - start)
        partial[..., :live] = fma32(a[..., start:start + live], b[..., start:start + live], partial[..., :live])
    return tree_sum(partial)
