"""Rotary position embedding, partial and rotate-half (NeoX pairing), as Qwen3.5 applies it to queries and keys.

For a head vector x and rotary dim R (only dims [0, R) rotate), pair j < R/2 rotates (x[j], x[j + R/2]) by the
angle `position * theta ** (-2j / R)`.

Numerics: angles, cosines and sines are computed in float64 and rounded to float32 (the table a kernel would read);
each rotated value `x * cos - y * sin` is evaluated in float64 from float32 operands (the products are exact) and
rounded once, so NumPy and the GPU round it alike.

Mapping (the kernel): one thread per (row, head, pair j).
"""
import numpy as np


def rope_table(positions, rotary_dim, theta):
    """cos and sin, float32 [len(positions), rotary_dim / 2]."""
    half = rotary_dim // 2
    inv_freq = 1.0 / (np.float64(theta) ** (np.arange(half, dtype=np.float64) * 2.0 / rotary_dim))
    angles = np.asarray(positions, np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def rope(x, positions, rotary_dim, theta):
    """x [rows, heads, head_dim] rotated at each row's position; dims >= rotary_dim pass through."""
    cos, sin = rope_table(positions, rotary_dim, theta)
    cos = cos[:, None, :].astype(np.float64)
    sin = sin[:, None, :].astype(np.float64)
    half = rotary_dim // 2
    first = x[:, :, :half].astype(np.float64)
    second = x[:, :, half:rotary_dim].astype(np.float64)
    out = np.array(x, np.float32, copy=True)
    out[:, :, :half] = first * cos - second * sin
    out[:, :, half:rotary_dim] = second * cos + first * sin
    return out
