"""Weights as they are stored, read on the device: float32, bf16 and MLX affine 4/8-bit.

* bf16: uint16 bit patterns, the top half of the float32 (`bits << 16`), exact.
* affine (MLX): codes packed into uint32 words [out, K * bits / 32], a float32 scale and bias per group of
  columns [out, K / group_size]. Column `k` of row `o` is `fma_rn(scales[o, g], q, biases[o, g])` with
  `g = k // group_size` and the code `q` taken from word `k // (32 // bits)` at bit offset
  `bits * (k % (32 // bits))` (element 0 in the lowest bits); a code is a small integer, exact as float32.

Two kernels read them. The embedding looks rows up by token id: one thread per (row, column) of the output, the
twins `weight[ids]`, `bf16_to_f32(bits[ids])` and `affine_rows(..., ids)` (numerics/formats.py). The GEMV
(gemv.py) reads a float weight a chunk of CHUNK columns at a time, through the formats below, and widens each bf16
weight where it multiplies it; affine weights go through the integer GEMM (gemm.py), which reads their codes
whole.
"""
import collections

import numpy as np
from numba import cuda

from tensorfold.cuda.fmath import fma_rn
from tensorfold.device import SIMULATED
from tensorfold.device.grid import BLOCK, blocks_for
from tensorfold.device.launch import kernel

CHUNK = 8  # columns the GEMV takes at a time: one uint32 of 4-bit codes, two of 8-bit, 16 bytes of bf16


if SIMULATED:  # the GEMV's kernels (gemv.py) call this once per pair of x values, from another file: see below
    def f32_from_bits(bits):
        """The float32 with these 32 bits (uint32); here, NumPy's view of the scalar. A plain function: the
        simulator runs a device function with its file's `cuda` swapped for the kernel's, unlocked, one call at a
        time, and a call from another file's kernel that returns puts the real module back while other threads
        still run the function: a `cuda.local` read then fails in them."""
        return np.uint32(bits).view(np.float32)
else:
    @cuda.jit(device=True)
    def f32_from_bits(bits):
        """The float32 with these 32 bits (uint32): exact, through a one-element local array (no bit-cast)."""
        word = cuda.local.array(1, np.uint32)
        word[0] = bits
        return word.view(np.float32)[0]


@cuda.jit(device=True)
def bf16_bits_to_f32(bits):
    """The float32 whose top half is `bits` (bf16): exact."""
    return f32_from_bits(np.uint32(bits) << 16)


# --- the embedding: rows looked up by token id; thread i owns element (i // width, i % width) of the output -------

@kernel
def embed_f32_kernel(ids, weight, out):
    i = cuda.grid(1)
    if i < out.size:
        r, k = i // out.shape[1], i % out.shape[1]
        out[r, k] = weight[ids[r], k]


@kernel
def embed_bf16_kernel(ids, weight_bits, out):
    i = cuda.grid(1)
    if i < out.size:
        r, k = i // out.shape[1], i % out.shape[1]
        out[r, k] = bf16_bits_to_f32(weight_bits[ids[r], k])


@kernel
def embed_affine_kernel(ids, packed, scales, biases, bits, group_size, out):
    i = cuda.grid(1)
    if i < out.size:
        r, k = i // out.shape[1], i % out.shape[1]
        per_word = 32 // bits
        code = (packed[ids[r], k // per_word] >> np.uint32(bits * (k % per_word))) & np.uint32((1 << bits) - 1)
        g = k // group_size
        out[r, k] = fma_rn(scales[ids[r], g], np.float32(code), biases[ids[r], g])


def launch_embed(kernel, ids, in_features, *weight_args, stream=0):
    """Launch an embedding kernel for device int32 `ids`; returns float32 [len(ids), in_features]."""
    out = cuda.device_array((ids.shape[0], in_features), np.float32, stream=stream)
    kernel[blocks_for(out.size), BLOCK, stream](ids, *weight_args, out)
    return out


# --- the formats the GEMV's tile kernel holds a chunk in ----------------------------------------------------------
# A format says what a warp holds of a chunk as stored (`hold`) and how column e's float32 weight comes out of it
# (`weight`): a bf16 weight is widened where the kernel multiplies it, once a tile.
# `*_format()` returns a `WeightFormat`: `hold(data, row, chunk, columns, words, floats, j, careful)` puts an
# output's chunk into words[j * WORDS:] (uint32) and floats[j * FLOATS:] (float32); `weight(words, floats, j, e)`
# is column e's weight. `data` is the flat weight, the output's row starting at `row`; `row` and `chunk` are
# unsigned (the kernel finds an output's row once). `careful`: the chunk may reach past the last column, whose
# weight is then reloaded (nothing adds it).

WeightFormat = collections.namedtuple("WeightFormat", "words floats hold weight")


def f32_format():
    """float32 as stored: the chunk's CHUNK floats."""
    @cuda.jit(device=True)
    def hold(weight, row, chunk, columns, words, floats, j, careful):
        for e in range(CHUNK):
            column = chunk * np.uint64(CHUNK) + np.uint64(e)
            if careful:
                column = min(column, np.uint64(columns - 1))
            floats[j * CHUNK + e] = weight[row + column]

    @cuda.jit(device=True)
    def weight(words, floats, j, e):
        return floats[j * CHUNK + e]
    return WeightFormat(1, CHUNK, hold, weight)  # (its one word a chunk unused)


def bf16_format():
    """bf16: the chunk's CHUNK stored 16 bits, each widened to float32 where it is used, exactly."""
    @cuda.jit(device=True)
    def hold(weight_bits, row, chunk, columns, words, floats, j, careful):
        for e in range(CHUNK):
            column = chunk * np.uint64(CHUNK) + np.uint64(e)
            if careful:
                column = min(column, np.uint64(columns - 1))
            words[j * CHUNK + e] = weight_bits[row + column]

    @cuda.jit(device=True)
    def weight(words, floats, j, e):
        return bf16_bits_to_f32(words[j * CHUNK + e])
    return WeightFormat(CHUNK, 1, hold, weight)  # (its one float a chunk unused)
