"""Rotary position embedding, partial and rotate-half (NeoX pairing), as Qwen3.5 applies it to queries and keys.

For a head vector x and rotary dim R (only dims [0, R) rotate), pair j < R/2 rotates (x[j], x[j + R/2]) by the
angle `position * theta ** (-2j / R)`:

    x'[j]         = x[j] cos - x[j + R/2] sin
    x'[j + R/2]   = x[j + R/2] cos + x[j] sin

Numerics: the angle `position * inv_freq[j]`, its cosine and its sine are computed in float64 and the cosine and
sine rounded to float32 (`rope_cos_sin`, the table a kernel would otherwise read); each rotated value is evaluated
in float64 from float32 operands (the products are exact) and rounded once (`rotate32`), so NumPy and the GPU
round it alike. Both are device functions: the twin calls their `py_func` on arrays, the kernel calls them on one
pair.

The inverse frequencies `theta ** (-2j / R)` are the one thing the kernel does not compute itself: the host
computes them once per (R, theta) with the twin's own expression (`inverse_frequencies`) and the kernel reads
them. A float64 `pow` is not correctly rounded anywhere: libdevice's differs from NumPy's in the last ulp for about
a fifth of the (theta, R, j) triples we tried, and NumPy's own differs between CPUs (AVX-512 or not); a one-ulp
error in a frequency is then multiplied by the position, and with each side computing its own, 131 of the 8.4M
(position < 262144, pair) values of the released setting (R 64, theta 1e7) came out differently on an H200.

The float64 `cos` and `sin` still come from NumPy on the host and from libdevice on the GPU, and differ in the last
float64 ulp for about one angle in six. Rounded to float32 they agree unless the float64 value lies within that
ulp of a float32 rounding boundary: a chance of about 1e-8 per value (over 2M random angles up to 3e5, and over
every position below 262144 at the released setting, none differed on an H200).

Mapping (the kernel): one thread per (row, head, pair j). It computes the pair's cos and sin from the row's
position and inv_freq[j] (no cos/sin table is uploaded), rotates its two elements, and copies the pass-through
dims R + j, R + j + R/2, ... of its head.
"""
import numpy as np
from numba import cuda

from ..contract import KernelCheck
from .common import BLOCK, blocks_for, swap_rows, to_host
from .launch import kernel


def inverse_frequencies(rotary_dim, theta):
    """inv_freq[j] = 1 / theta ** (2j / R) for j < R/2, float64; the host computes it for the twin and the kernel."""
    return 1.0 / np.float64(theta) ** (np.arange(rotary_dim // 2, dtype=np.float64) * 2.0 / rotary_dim)


@cuda.jit(device=True)
def rope_cos_sin(position, inv_freq):
    """cos and sin of the angle position * inv_freq, evaluated in float64 and rounded to float32."""
    angle = np.float64(position) * inv_freq
    return np.float32(np.cos(angle)), np.float32(np.sin(angle))


@cuda.jit(device=True)
def rotate32(a, cos, b, sin):
    """a * cos + b * sin evaluated in float64 from float32 operands (exact products), rounded once to float32."""
    return np.float32(np.float64(a) * np.float64(cos) + np.float64(b) * np.float64(sin))


def rope_table(positions, rotary_dim, theta):
    """cos and sin, float32 [len(positions), rotary_dim / 2]."""
    return rope_cos_sin.py_func(np.asarray(positions)[:, None], inverse_frequencies(rotary_dim, theta)[None, :])


def rope(x, positions, rotary_dim, theta):
    """x [rows, heads, head_dim] rotated at each row's position; dims >= rotary_dim pass through."""
    cos, sin = rope_table(positions, rotary_dim, theta)
    cos, sin = cos[:, None, :], sin[:, None, :]
    half = rotary_dim // 2
    first, second = x[:, :, :half], x[:, :, half:rotary_dim]
    out = np.array(x, np.float32, copy=True)  # dims >= rotary_dim pass through
    out[:, :, :half] = rotate32.py_func(first, cos, second, -sin)
    out[:, :, half:rotary_dim] = rotate32.py_func(second, cos, first, sin)
    return out


# --- the kernels --------------------------------------------------------------------------------------------------
# Thread i owns pair j of head h of row r, with i = (r * heads + h) * (R / 2) + j.

@kernel
def rope_kernel(x, positions, inv_freq, y):
    i = cuda.grid(1)
    half = inv_freq.size
    heads, head_dim = x.shape[1], x.shape[2]
    if i < x.shape[0] * heads * half:
        r, h, j = i // (heads * half), (i // half) % heads, i % half
        cos, sin = rope_cos_sin(positions[r], inv_freq[j])
        first, second = x[r, h, j], x[r, h, j + half]
        y[r, h, j] = rotate32(first, cos, second, -sin)
        y[r, h, j + half] = rotate32(second, cos, first, sin)
        for k in range(2 * half + j, head_dim, half):  # this thread's share of the pass-through dims
            y[r, h, k] = x[r, h, k]


_FREQUENCIES = {}  # (rotary_dim, theta) -> inverse_frequencies on the device, uploaded on first use


def rope_launch(x, positions, rotary_dim, theta, stream=0):
    """x [rows, heads, head_dim] and positions [rows] (int) on the device; returns the rotated copy.

    The first call for a (rotary_dim, theta) uploads its inverse frequencies (R/2 float64 values); later calls,
    a captured CUDA graph's among them, reuse them.
    """
    key = (int(rotary_dim), float(theta))
    if key not in _FREQUENCIES:
        _FREQUENCIES[key] = cuda.to_device(inverse_frequencies(rotary_dim, theta), stream=stream)
    y = cuda.device_array(tuple(x.shape), np.float32, stream=stream)
    threads = x.shape[0] * x.shape[1] * (rotary_dim // 2)
    rope_kernel[blocks_for(threads), BLOCK, stream](x, positions, _FREQUENCIES[key], y)
    return y


# --- the contract -------------------------------------------------------------------------------------------------

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


CONTRACT = [
    KernelCheck("rope", rope, _launch, _cases,
                {"off-by-one position": lambda i: {**i, "positions": i["positions"] + 1},
                 "two swapped rows": swap_rows("x")}),
]
