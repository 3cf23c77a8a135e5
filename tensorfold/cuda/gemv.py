"""GEMV over a round's rows: y[r, o] = sum_k W[o, k] * x[r, k], for float32, bf16 and MLX affine 4/8-bit weights.

Mapping (the kernel): one block of `THREADS` threads per output `o`; the block reads row `o` of the weights once and
serves every row `r` of the round. Thread `t` walks the columns `k = t, t + THREADS, ...` and keeps one float32
accumulator per row; the block then adds its `THREADS` partial sums in a fixed shared-memory tree.

Why this shape: each output's reduction order (the column stride, then the tree) depends only on `K` and
`THREADS`, never on how many rows the round has, so a prompt of 300 rows and 300 one-row steps give the same bits.

Weights are dequantized inside the loop, column by column, and never materialised:

* bf16: the 16 stored bits are the top half of the float32 (`bits << 16`), exact.
* affine (MLX): column `k` of output `o` is `scales[o, g] * q + biases[o, g]` with `g = k // group_size` and the
  code `q` taken from the packed uint32 word `k // (32 // bits)` at bit offset `bits * (k % (32 // bits))`
  (element 0 in the lowest bits).
"""
import numpy as np
from numba import cuda

from ..contract import KernelCheck
from .common import BLOCK, blocks_for, drop_row, swap_rows, to_host
from .fmath import fma32, tree_sum

THREADS = 128  # threads per block: the column stride and the width of the reduction tree
TILE_ELEMENTS = 1 << 21  # the twin takes outputs in tiles of about this many accumulators (bounds its memory)


def bf16_to_f32(bits):
    """bf16 bit patterns (uint16) to float32 values, exactly."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values):
    """float32 values to bf16 bit patterns, rounding to nearest even; NaN stays a quiet NaN."""
    bits = np.asarray(values, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)


def affine_rows(packed, scales, biases, bits, group_size, outs):
    """Dequantize the rows `outs` of an affine-quantized weight: float32 [len(outs), K]."""
    per_word = 32 // bits
    words = packed[outs]  # [rows, K / per_word]
    shifts = np.arange(per_word, dtype=np.uint32) * np.uint32(bits)  # element e of a word sits at bit bits * e
    codes = ((words[:, :, None] >> shifts) & np.uint32((1 << bits) - 1)).reshape(len(words), -1)
    return fma32.py_func(np.repeat(scales[outs], group_size, axis=1), codes.astype(np.float32),
                         np.repeat(biases[outs], group_size, axis=1))


def gemv(x, weight_rows, out_features):
    """The twin: y[r, o] for every row of `x` [rows, K], reading weight rows through `weight_rows(outs)`.

    The twin takes a tile of outputs at a time (for memory) and runs the threads' strided walk as a loop over steps,
    each step vectorised over (row, output, thread); float64 buffers make each step's `fma32` one NumPy pass.
    """
    x64 = np.asarray(x, np.float64)
    rows, in_features = x64.shape
    y = np.empty((rows, out_features), np.float32)
    tile = max(1, TILE_ELEMENTS // (rows * THREADS))
    for first in range(0, out_features, tile):
        outs = np.arange(first, min(first + tile, out_features))
        w64 = np.asarray(weight_rows(outs), np.float64)  # this tile's weights, dequantized once for every row
        partial = np.zeros((rows, len(outs), THREADS), np.float32)  # one accumulator per (row, output, thread)
        step = np.empty((rows, len(outs), THREADS), np.float64)
        for start in range(0, in_features, THREADS):  # step j of every thread's walk: column start + t
            live = min(THREADS, in_features - start)  # threads past the last column have nothing more to add
            exact = step[:, :, :live]
            np.multiply(w64[None, :, start:start + live], x64[:, None, start:start + live], out=exact)
            np.add(exact, partial[:, :, :live], out=exact)
            partial[:, :, :live] = exact  # fma32: the float64 sum rounded once to float32
        y[:, outs] = tree_sum(partial)
    return y


def gemv_f32(x, weight):
    """y = x @ weight.T for a float32 weight [out, K]."""
    return gemv(x, lambda outs: weight[outs], weight.shape[0])


def gemv_bf16(x, weight_bits):
    """y = x @ weight.T for a bf16 weight stored as uint16 bit patterns [out, K]."""
    return gemv(x, lambda outs: bf16_to_f32(weight_bits[outs]), weight_bits.shape[0])


def gemv_affine(x, packed, scales, biases, bits, group_size):
    """y = x @ W.T for an MLX affine weight: packed uint32 [out, K * bits / 32], float32 scales and biases [out, K / gs]."""
    return gemv(x, lambda outs: affine_rows(packed, scales, biases, bits, group_size, outs), packed.shape[0])


# --- the kernels --------------------------------------------------------------------------------------------------
# Block (o, g) computes output o for the rows [g * ROWS, (g + 1) * ROWS) of the round; thread t walks the columns
# t, t + THREADS, ... and keeps one accumulator per row in shared memory, so each weight is read once per block.
# The three kernels differ only in the line that reads a weight.

ROWS = 16  # rows per block: a decode round (up to 16 rows) reads the weights exactly once


@cuda.jit(device=True)
def block_tree_sum(partial, rows, t):
    """Add each row's THREADS partial sums in the fixed halving tree; the sums end in partial[r, 0]."""
    width = THREADS // 2
    while width > 0:
        cuda.syncthreads()
        if t < width:
            for r in range(rows):
                partial[r, t] += partial[r, t + width]
        width //= 2
    cuda.syncthreads()


@cuda.jit(device=True)
def bf16_bits_to_f32(bits):
    """The float32 whose top half is `bits`: exact, and the same in the simulator (no bf16 type needed)."""
    word = cuda.local.array(1, np.uint32)
    word[0] = np.uint32(bits) << 16
    return word.view(np.float32)[0]


@cuda.jit
def gemv_f32_kernel(x, weight, y):
    o, first, t = cuda.blockIdx.x, cuda.blockIdx.y * ROWS, cuda.threadIdx.x
    rows = min(ROWS, x.shape[0] - first)
    partial = cuda.shared.array((ROWS, THREADS), np.float32)
    for r in range(rows):
        partial[r, t] = 0
    for k in range(t, x.shape[1], THREADS):
        w = weight[o, k]
        for r in range(rows):
            partial[r, t] = fma32(w, x[first + r, k], partial[r, t])
    block_tree_sum(partial, rows, t)
    if t == 0:
        for r in range(rows):
            y[first + r, o] = partial[r, 0]


@cuda.jit
def gemv_bf16_kernel(x, weight_bits, y):
    o, first, t = cuda.blockIdx.x, cuda.blockIdx.y * ROWS, cuda.threadIdx.x
    rows = min(ROWS, x.shape[0] - first)
    partial = cuda.shared.array((ROWS, THREADS), np.float32)
    for r in range(rows):
        partial[r, t] = 0
    for k in range(t, x.shape[1], THREADS):
        w = bf16_bits_to_f32(weight_bits[o, k])
        for r in range(rows):
            partial[r, t] = fma32(w, x[first + r, k], partial[r, t])
    block_tree_sum(partial, rows, t)
    if t == 0:
        for r in range(rows):
            y[first + r, o] = partial[r, 0]


@cuda.jit
def gemv_affine_kernel(x, packed, scales, biases, bits, group_size, y):
    o, first, t = cuda.blockIdx.x, cuda.blockIdx.y * ROWS, cuda.threadIdx.x
    rows = min(ROWS, x.shape[0] - first)
    per_word = 32 // bits
    mask = np.uint32((1 << bits) - 1)
    partial = cuda.shared.array((ROWS, THREADS), np.float32)
    for r in range(rows):
        partial[r, t] = 0
    for k in range(t, x.shape[1], THREADS):
        code = (packed[o, k // per_word] >> np.uint32(bits * (k % per_word))) & mask
        g = k // group_size
        w = fma32(scales[o, g], np.float32(code), biases[o, g])
        for r in range(rows):
            partial[r, t] = fma32(w, x[first + r, k], partial[r, t])
    block_tree_sum(partial, rows, t)
    if t == 0:
        for r in range(rows):
            y[first + r, o] = partial[r, 0]


def launch_gemv(kernel, x, out_features, *weight_args, stream=0):
    """Launch one of the GEMV kernels: a grid of (outputs, row groups), THREADS threads each; returns y."""
    y = cuda.device_array((x.shape[0], out_features), np.float32, stream=stream)
    grid = (out_features, -(-x.shape[0] // ROWS))
    kernel[grid, THREADS, stream](x, *weight_args, y)
    return y


# --- embedding rows: the lookup of token ids, dequantized like the GEMV's weights -----------------------------------
# Twins: `weight[ids]`, `bf16_to_f32(bits[ids])`, `affine_rows(..., ids)`. Kernel mapping: one thread per
# (row, column) of the output.

@cuda.jit
def embed_f32_kernel(ids, weight, out):
    i = cuda.grid(1)
    if i < out.size:
        r, k = i // out.shape[1], i % out.shape[1]
        out[r, k] = weight[ids[r], k]


@cuda.jit
def embed_bf16_kernel(ids, weight_bits, out):
    i = cuda.grid(1)
    if i < out.size:
        r, k = i // out.shape[1], i % out.shape[1]
        out[r, k] = bf16_bits_to_f32(weight_bits[ids[r], k])


@cuda.jit
def embed_affine_kernel(ids, packed, scales, biases, bits, group_size, out):
    i = cuda.grid(1)
    if i < out.size:
        r, k = i // out.shape[1], i % out.shape[1]
        per_word = 32 // bits
        code = (packed[ids[r], k // per_word] >> np.uint32(bits * (k % per_word))) & np.uint32((1 << bits) - 1)
        g = k // group_size
        out[r, k] = fma32(scales[ids[r], g], np.float32(code), biases[ids[r], g])


def launch_embed(kernel, ids, in_features, *weight_args, stream=0):
    """Launch an embedding kernel for device int32 `ids`; returns float32 [len(ids), in_features]."""
    out = cuda.device_array((ids.shape[0], in_features), np.float32, stream=stream)
    kernel[blocks_for(out.size), BLOCK, stream](ids, *weight_args, out)
    return out


# --- the contract -------------------------------------------------------------------------------------------------

def _cases(mode, rng):
    """(rows, outputs, columns): tiny under the simulator; the projections of Qwen3.5-0.8B/2B and odd sizes on GPU."""
    if mode == "sim":
        shapes = [(1, 3, 200), (3, 2, 128), (17, 2, 130)]
    else:
        shapes = [(1, 6144, 1024), (16, 3584, 1024), (128, 1024, 3584), (1, 2048, 6144), (16, 6144, 2048),
                  (3, 1000, 1088), (17, 248, 2048)]
    return [(f"{rows}x{outs}x{cols}", {"x": rng.normal(size=(rows, cols)).astype(np.float32),
                                         "weight": rng.normal(size=(outs, cols)).astype(np.float32)})
            for rows, outs, cols in shapes]


def _quantized_cases(bits):
    def cases(mode, rng):
        from ..model.writer import quantize_affine
        out = []
        for label, inputs in _cases(mode, rng):
            if inputs["x"].shape[1] % 64:
                continue
            packed, scales, biases = quantize_affine(inputs["weight"], bits, 64)
            out.append((label, {"x": inputs["x"], "packed": packed, "scales": bf16_to_f32(scales),
                                "biases": bf16_to_f32(biases), "bits": bits, "group_size": 64}))
        return out
    return cases


def _bf16_cases(mode, rng):
    return [(label, {"x": i["x"], "weight_bits": f32_to_bf16(i["weight"])}) for label, i in _cases(mode, rng)]


def _launch_f32(x, weight):
    return to_host(launch_gemv(gemv_f32_kernel, cuda.to_device(x), weight.shape[0], cuda.to_device(weight)))


def _launch_bf16(x, weight_bits):
    return to_host(launch_gemv(gemv_bf16_kernel, cuda.to_device(x), weight_bits.shape[0], cuda.to_device(weight_bits)))


def _launch_affine(x, packed, scales, biases, bits, group_size):
    return to_host(launch_gemv(gemv_affine_kernel, cuda.to_device(x), packed.shape[0], cuda.to_device(packed),
                               cuda.to_device(scales), cuda.to_device(biases), bits, group_size))


def _wrong_group(inputs):
    """Planted: every weight read with the scales of the neighbouring group."""
    return {**inputs, "scales": np.roll(inputs["scales"], 1, axis=1)}


_ROW_CONTROLS = {"two swapped rows": swap_rows("x"), "a dropped row": drop_row("x")}
CONTRACT = [
    KernelCheck("gemv_f32", gemv_f32, _launch_f32, _cases, _ROW_CONTROLS),
    KernelCheck("gemv_bf16", gemv_bf16, _launch_bf16, _bf16_cases, _ROW_CONTROLS),
    KernelCheck("gemv_affine4", gemv_affine, _launch_affine, _quantized_cases(4),
                {**_ROW_CONTROLS, "a wrong group index": _wrong_group}),
    KernelCheck("gemv_affine8", gemv_affine, _launch_affine, _quantized_cases(8),
                {**_ROW_CONTROLS, "a wrong group index": _wrong_group}),
]


def _embed_cases(mode, rng):
    from ..model.writer import quantize_affine
    vocab, width, rows = (40, 128, 5) if mode == "sim" else (248320, 1024, 128)
    weight = rng.normal(size=(vocab, width)).astype(np.float32)
    packed, scales, biases = quantize_affine(weight, 4, 64)
    ids = rng.integers(0, vocab, rows).astype(np.int32)
    return [(f"{rows} ids of {vocab}x{width}", {"ids": ids, "weight": weight, "packed": packed,
                                                "scales": bf16_to_f32(scales), "biases": bf16_to_f32(biases)})]


def _embed_twin(ids, weight, packed, scales, biases):
    return weight[ids], bf16_to_f32(f32_to_bf16(weight)[ids]), affine_rows(packed, scales, biases, 4, 64, ids)


def _embed_launch(ids, weight, packed, scales, biases):
    d_ids, width = cuda.to_device(ids), weight.shape[1]
    return (to_host(launch_embed(embed_f32_kernel, d_ids, width, cuda.to_device(weight))),
            to_host(launch_embed(embed_bf16_kernel, d_ids, width, cuda.to_device(f32_to_bf16(weight)))),
            to_host(launch_embed(embed_affine_kernel, d_ids, width, cuda.to_device(packed), cuda.to_device(scales),
                                 cuda.to_device(biases), 4, 64)))


CONTRACT.append(KernelCheck("embed (f32, bf16, affine4)", _embed_twin, _embed_launch, _embed_cases,
                            {"two swapped ids": swap_rows("ids"), "id off by one": lambda i: {**i, "ids": (i["ids"] + 1) % len(i["weight"])},
                             "a wrong group index": _wrong_group}))
