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
them. A float64 `pow` is not correctly rounded anywhere: libdevice's can differ from NumPy's in the last ulp, and
NumPy's own differs between CPUs (AVX-512 or not); a one-ulp error in a frequency is then multiplied by the
position, so with each side computing its own, the rotated values of long positions would differ.

The float64 `cos` and `sin` still come from NumPy on the host and from libdevice on the GPU, and can differ in the
last float64 ulp. Rounded to float32 they agree unless the float64 value lies within that ulp of a float32
rounding boundary: a chance of about 1e-8 per value.

Mapping (the kernel): one thread per (row, head, pair j). It computes the pair's cos and sin from the row's
position and inv_freq[j] (no cos/sin table is uploaded), rotates its two elements, and copies the pass-through
dims R + j, R + j + R/2, ... of its head.

The attention layer's queries and keys are normalised per head and then rotated: `norm_rope` does both, for q and k,
in one launch, where taking the query out of q_proj's output, two RMSNorms and two RoPEs would be five. Mapping: a
block of rmsnorm.THREADS threads per (row, query or key head); the block normalises its head with rmsnorm's tree
and keeps it in shared memory, then thread j rotates pair j and the rest copy the pass-through dims, the arithmetic
of `rope_kernel`.
"""
import numpy as np
from numba import cuda

from tensorfold.cuda import (
    rmsnorm as norm,  # its THREADS read through the module when a launch is sized: tests patch it
)
from tensorfold.cuda.rmsnorm import block_inverse_rms, thread_squares
from tensorfold.device.grid import BLOCK, blocks_for
from tensorfold.device.launch import kernel

MAX_HEAD_DIM = 256  # the longest head norm_rope holds in shared memory (Qwen3.5: 256)


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


def norm_rope(q_and_gate, k, q_multiplier, k_multiplier, eps, positions, rotary_dim, theta):
    """The attention layer's queries and keys as its partials read them: q from the query half of each head of
    q_proj's output [rows, heads, 2 hd], k [rows, kv_heads, hd]; each head RMS-normalised with its multiplier, then
    rotated at its row's position."""
    hd = k.shape[2]
    q = rope(norm.rmsnorm(q_and_gate[:, :, :hd], q_multiplier, eps), positions, rotary_dim, theta)
    return q, rope(norm.rmsnorm(k, k_multiplier, eps), positions, rotary_dim, theta)


# --- the kernels --------------------------------------------------------------------------------------------------
# rope_kernel: thread i owns pair j of head h of row r, with i = (r * heads + h) * (R / 2) + j.

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


@kernel
def norm_rope_kernel(q_and_gate, k, q_multiplier, k_multiplier, eps, positions, inv_freq, q_out, k_out):
    """Block (row r, slot): slots 0 .. heads - 1 are row r's query heads, the rest its key heads. q_and_gate comes
    as [rows * heads, 2 hd], q_out as [rows * heads, hd], k and k_out as [rows * kv_heads, hd]."""
    rows, hd = positions.shape[0], k_out.shape[1]
    heads, kv_heads = q_out.shape[0] // rows, k_out.shape[0] // rows
    slots, t, threads = heads + kv_heads, cuda.threadIdx.x, cuda.blockDim.x  # norm.THREADS threads
    r, slot = cuda.blockIdx.x // slots, cuda.blockIdx.x % slots
    head = cuda.shared.array(MAX_HEAD_DIM, np.float32)  # the normalised head
    if slot < heads:
        source, n, multiplier, out = q_and_gate, r * heads + slot, q_multiplier, q_out
    else:
        source, n, multiplier, out = k, r * kv_heads + slot - heads, k_multiplier, k_out
    inv = block_inverse_rms(thread_squares(source, n, 0, hd, t), t, hd, eps, True)
    for i in range(t, hd, threads):
        head[i] = source[n, i] * inv * multiplier[i]
    cuda.syncthreads()  # the whole head is normalised before any pair is rotated
    half = inv_freq.size
    for j in range(t, half, threads):
        cos, sin = rope_cos_sin(positions[r], inv_freq[j])
        out[n, j] = rotate32(head[j], cos, head[j + half], -sin)
        out[n, j + half] = rotate32(head[j + half], cos, head[j], sin)
    for i in range(2 * half + t, hd, threads):  # the pass-through dims
        out[n, i] = head[i]


_FREQUENCIES = {}  # (rotary_dim, theta) -> inverse_frequencies on the device, uploaded on first use


def frequencies(rotary_dim, theta, stream=0):
    """inverse_frequencies on the device. The first call for a (rotary_dim, theta) uploads them (R/2 float64
    values); later calls, a captured CUDA graph's among them, reuse them."""
    key = (int(rotary_dim), float(theta))
    if key not in _FREQUENCIES:
        _FREQUENCIES[key] = cuda.to_device(inverse_frequencies(rotary_dim, theta), stream=stream)
    return _FREQUENCIES[key]


def rope_launch(x, positions, rotary_dim, theta, stream=0):
    """x [rows, heads, head_dim] and positions [rows] (int) on the device; returns the rotated copy."""
    y = cuda.device_array(tuple(x.shape), np.float32, stream=stream)
    threads = x.shape[0] * x.shape[1] * (rotary_dim // 2)
    rope_kernel[blocks_for(threads), BLOCK, stream](x, positions, frequencies(rotary_dim, theta, stream), y)
    return y


def norm_rope_launch(q_and_gate, k, q_multiplier, k_multiplier, eps, positions, rotary_dim, theta, stream=0):
    """norm_rope on the device: q_and_gate [rows, heads, 2 hd], k [rows, kv_heads, hd], the multipliers [hd] and
    positions [rows] (int); returns (q [rows, heads, hd], k [rows, kv_heads, hd]), new arrays, one launch."""
    rows, heads, kv_heads, hd = k.shape[0], q_and_gate.shape[1], k.shape[1], k.shape[2]
    assert hd <= MAX_HEAD_DIM, f"a head of {hd} > MAX_HEAD_DIM = {MAX_HEAD_DIM}"
    q_out = cuda.device_array((rows * heads, hd), np.float32, stream=stream)
    k_out = cuda.device_array((rows * kv_heads, hd), np.float32, stream=stream)
    norm_rope_kernel[rows * (heads + kv_heads), norm.THREADS, stream](
        q_and_gate.reshape(rows * heads, 2 * hd), k.reshape(rows * kv_heads, hd), q_multiplier, k_multiplier, eps,
        positions, frequencies(rotary_dim, theta, stream), q_out, k_out)
    return q_out.reshape(rows, heads, hd), k_out.reshape(rows, kv_heads, hd)
