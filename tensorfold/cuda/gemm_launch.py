"""Launching the exact GEMM of gemm.py: which of its kernels a call takes and in what tile, the grid, the outputs.

    launch_gemm(x, ...)       x's quantize (quantize.py), then `launch_products`
    launch_products(...)      a round's few rows: `round_kernel` (products and finish in one launch) where K is at
                              most ROUND_CHUNKS chunks, else the products a chunk of K a block and the combine; a
                              prompt chunk's rows: `whole_kernel` (each warp walks all of K and finishes its outputs)
                              where its grid fills the GPU (`whole_fills`), else the same chunks and combine

Every choice here is one of speed only: each kernel and tile gives the same bits (gemm.py's arithmetic fixes the
order of every sum by K alone).
"""
import numpy as np
from numba import cuda

from tensorfold.cuda.gemm import (CHUNK_COLUMNS, PROMPT_ROW_HALVES, PROMPT_TILES, ROUND_CHUNKS, ROUND_ROWS, ROUND_TILES,
                                  WARPS, WHOLE_BLOCKS, WIDE_OUTPUTS, WIDE_TILES, combine_kernel, gemm_kernel,
                                  round_kernel, whole_kernel)
from tensorfold.cuda.gemv import PARTS
from tensorfold.cuda.quantize import launch_quantize, step_shape
from tensorfold.device.grid import BLOCK, blocks_for, flat, multiprocessors


def kernel_shape(rows, bits, group_size, columns, out_features=0):
    """(words of codes a lane a step, row halves, output tiles a warp) of a call: a round's rows (up to ROUND_ROWS)
    one tile of 8 or 16 rows and the widest step whose groups a lane can hold, WIDE_TILES tiles where the weight is
    that wide and the tile 8 rows; more rows, the prompt kernel's tiles and the widest step inside one group (so every
    combination of an mma is some lane's own: no zero A rows). A choice of speed only: every shape gives the same
    bits."""
    if rows > ROUND_ROWS:
        wide, narrow = (2, 1) if bits == 4 else (4, 2)  # steps of 64 columns, else of 32
        span = step_shape(bits, wide)[0]
        words = wide if columns % span == 0 and group_size % span == 0 else narrow
        return words, PROMPT_ROW_HALVES, PROMPT_TILES
    for words in ((4, 2, 1) if bits == 4 else (4, 2)):
        span = step_shape(bits, words)[0]
        if columns % span == 0 and 4 * group_size >= span and (span % group_size == 0 or group_size % span == 0):
            wide = rows <= 8 and out_features >= WIDE_OUTPUTS
            return words, row_halves_for(rows), WIDE_TILES if wide else ROUND_TILES
    raise ValueError(f"no step of {bits}-bit codes fits {columns} columns in groups of {group_size}")


def row_halves_for(rows) -> int:
    """The row halves (8 rows each) of `kernel_shape`'s row tile for a call of `rows` rows: one tile of 8 or 16 rows
    for a round, PROMPT_ROW_HALVES for more."""
    return 1 if rows <= 8 else 2 if rows <= ROUND_ROWS else PROMPT_ROW_HALVES


def quantize_shape(rows, bits, group_size, columns) -> tuple:
    """(words, rows_pad): the layout a call of `rows` rows quantizes x in, its step's words and its rows padded to
    whole tiles of 8 * row_halves rows."""
    words, row_halves, _ = kernel_shape(rows, bits, group_size, columns)
    return words, -(-rows // (8 * row_halves)) * 8 * row_halves


def launch_gemm(x, out_features, packed, scales, biases, bits, group_size, stream=0, parts=None, gated=False):
    """Run the GEMM over the rows of the device array x [rows, K] with an affine weight (packed, scales, biases on
    the device). Returns y [rows, out_features]; with `parts` (up to PARTS widths that add up to out_features), a
    list of one array [rows, width] per part, each a contiguous piece of one output; `gated` (a weight of gate rows,
    then as many up rows), SiLU(gate) * up [rows, out_features / 2] (`swiglu`)."""
    rows, columns = x.shape
    words, rows_pad = quantize_shape(rows, bits, group_size, columns)
    quantized = launch_quantize(x, bits, group_size, words, rows_pad, stream)
    return launch_products(quantized, rows, out_features, packed, scales, biases, bits, group_size, stream, parts,
                           gated)


def launch_products(quantized, rows, out_features, packed, scales, biases, bits, group_size, stream=0, parts=None,
                    gated=False, out=None, whole=None):
    """The second half of `launch_gemm`: the GEMM kernel on x's digits, exponents and S (`launch_quantize`), then
    the combine. A round of ROUND_TILES tiles a warp and up to ROUND_CHUNKS chunks of K takes the round kernel, both
    in one launch, whose block is then no larger than the GEMM kernel's and holds about as many registers a thread;
    a wide weight's four tiles would lose a block a multiprocessor to registers, and more chunks would leave the
    multiprocessors fewer blocks: either reads its weights from memory slower. Otherwise a call whose grid fills the
    GPU without chunks (`whole_fills`, or `whole` given) takes the whole kernel, also one launch. `out`: the flat
    device array y is written into, if given."""
    digits, exponents, sums = quantized
    columns, rows_pad = digits.shape[2], digits.shape[1]
    words, row_halves, tiles = kernel_shape(rows, bits, group_size, columns, out_features)
    chunks = -(-columns // CHUNK_COLUMNS)
    count = out_features // 2 if gated else out_features
    arguments = (flat(digits).view(np.uint32), flat(exponents), flat(sums), columns, rows_pad, flat(packed),
                 packed.shape[1], flat(scales), flat(biases), scales.shape[1])
    written = 4 * tiles if gated else 8 * tiles  # outputs a warp writes
    row_tiles = rows_pad // (8 * row_halves)
    whole_grid = (-(-count // (WARPS * written)), row_tiles)
    if rows <= ROUND_ROWS and chunks <= ROUND_CHUNKS and tiles == ROUND_TILES and not whole:
        finishing = round_kernel(bits, group_size, words, row_halves, tiles, chunks, gated)[
            (-(-count // written), row_tiles), chunks * 32, stream]
    elif whole if whole is not None else whole_fills(rows, whole_grid[0] * whole_grid[1], chunks):
        finishing = whole_kernel(bits, group_size, words, row_halves, tiles, gated)[whole_grid, WARPS * 32, stream]
    else:
        finishing = None
    if finishing is not None:  # both kernels finish their outputs themselves, and take the same arguments
        y, ends = output_array(rows, out_features, parts, gated, stream, out)
        finishing(*arguments, rows, out_features, y, *ends)
        return output_views(y, rows, count, parts, ends)
    partials = cuda.device_array(chunks * rows * out_features, np.float64, stream=stream)
    gemm_kernel(bits, group_size, words, row_halves, tiles)[
        (output_blocks(out_features, tiles), row_tiles, chunks), WARPS * 32, stream](
        *arguments, partials, rows, out_features)
    return launch_combine(partials, chunks, rows, out_features, stream, parts, gated, out)


def output_blocks(out_features, tiles):
    """Blocks of WARPS warps of `tiles` tiles of 8 outputs that cover out_features outputs."""
    return -(-out_features // (8 * tiles * WARPS))


def launch_combine(partials, chunks, rows, out_features, stream=0, parts=None, gated=False, out=None):
    """The combine of the GEMM kernel's partial sums [chunks, rows, out_features]: y as `launch_gemm` returns it
    (written into `out`, if given)."""
    y, ends = output_array(rows, out_features, parts, gated, stream, out)
    count = out_features // 2 if gated else out_features
    combine_kernel(gated)[blocks_for(rows * count), BLOCK, stream](partials, chunks, rows, out_features, y, *ends)
    return output_views(y, rows, count, parts, ends)


def output_array(rows, out_features, parts, gated, stream, out=None):
    """The flat float32 output of a GEMM (its parts one after another, `output_index`), `out` if given, and the
    parts' ends."""
    widths = [out_features] if parts is None else list(parts)
    assert 1 <= len(widths) <= PARTS and sum(widths) == out_features, f"parts {widths} of {out_features} outputs"
    assert not gated or (parts is None and out_features % 2 == 0), "a gated GEMM has a gate for every up"
    ends = [int(e) for e in np.cumsum(widths)[:-1]] + [out_features] * (PARTS - len(widths))
    count = out_features // 2 if gated else out_features
    return cuda.device_array(rows * count, np.float32, stream=stream) if out is None else out, ends


def output_views(y, rows, count, parts, ends):
    """y [rows, count] of the flat output, or with `parts` one [rows, width] view a part."""
    if parts is None:
        return y.reshape(rows, count)
    starts = [0] + ends[:len(parts) - 1]
    return [y[start * rows:(start + width) * rows].reshape(rows, width) for start, width in zip(starts, parts)]


def whole_fills(rows, blocks, chunks) -> bool:
    """Whether a GEMM of `rows` rows walks the whole of K in each warp (`whole_kernel`) rather than a chunk a block
    and a combine: where K is one chunk, or where a prompt's rows make `blocks`, the whole kernel's grid, give every
    multiprocessor WHOLE_BLOCKS blocks (with fewer, the chunks' blocks keep more multiprocessors busy; a round's few
    rows read each weight once, and its chunks spread those reads). A choice of speed only: the same bits."""
    return chunks == 1 or (rows > ROUND_ROWS and blocks >= WHOLE_BLOCKS * multiprocessors())
