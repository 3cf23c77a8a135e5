"""RMSNorm in its three uses: `y = x / sqrt(mean(x^2) + eps) * weight`, the gated norm that multiplies by SiLU(z),
and the L2 norm of DeltaNet's queries and keys (`x / sqrt(sum(x^2) + eps)`, no mean).

Mapping (the kernel): one block of `THREADS` threads per (row, group), a group being the whole row or one head.
Thread t sums the squares of elements t, t + THREADS, ... with fma32; the block adds the partial sums in a tree;
then every thread scales its own elements.

Centred versus plain weights: Qwen3.5 stores most norm weights centred at zero (`1 + w` multiplies) and the gated
norm's plainly; the loader turns both into the multiplier itself, so the twin only ever multiplies.
"""
import numpy as np

from .fmath import block_dot, silu32

THREADS = 128


def inverse_rms(x, eps, mean=True):
    """1 / sqrt(sum(x^2) / n + eps) over the last axis (without `/ n` when `mean` is false), float32."""
    squares = block_dot(x, x, THREADS)
    if mean:
        squares = squares / np.float32(x.shape[-1])
    return np.float32(1.0) / np.sqrt(squares + np.float32(eps))


def rmsnorm(x, multiplier, eps):
    """x [..., width] normalised over its last axis and multiplied by `multiplier` [width]."""
    x = np.asarray(x, np.float32)
    return x * inverse_rms(x, eps)[..., None] * multiplier


def rmsnorm_gated(x, z, multiplier, eps):
    """The DeltaNet output norm: rmsnorm(x) * SiLU(z), over the last axis (one head's values)."""
    return rmsnorm(x, multiplier, eps) * silu32.py_func(z)


def l2norm(x, eps, scale=1.0):
    """x / sqrt(sum(x^2) + eps) over the last axis, times `scale` (DeltaNet's 1 / sqrt(dk) for queries)."""
    x = np.asarray(x, np.float32)
    y = x * inverse_rms(x, eps, mean=False)[..., None]
    return y * np.float32(scale) if scale != 1.0 else y
