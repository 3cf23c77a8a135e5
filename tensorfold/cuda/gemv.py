"""GEMV over a round's rows for float weights: y[r, o] = sum_k W[o, k] * x[r, k], float32 and bf16 (MLX affine
weights take the exact integer GEMM of gemm.py instead).

The order of the sums: the columns are cut into chunks of CHUNK = 8 (weights.py), and each output has THREADS = 32
threads. Thread t walks the chunks t, t + THREADS, t + 2 * THREADS, ..., each chunk's columns in order, adding
`fma_rn(w, x, acc)` (one float32 rounding, fmath.py) into one float32 accumulator per row; then the THREADS
partial sums are added in the halving tree of `tree_sum`. The order depends only on K, never on how many rows the
round has, so a prompt of 300 rows and 300 one-row steps give the same bits; and it is the same for both formats,
so a bf16 weight gives the bits of its float32 values.

The twin, `gemv`, runs the walk in rounds of THREADS chunks and steps e = 0 .. CHUNK - 1: at step e of round j
thread t takes column (j * THREADS + t) * CHUNK + e (none past the last column), in a few NumPy passes over
(thread, row, output); `walk_order` lays the columns out so that a step's are neighbours.

The kernel, `gemv_kernel`: a block has WARPS warps, each output a warp of THREADS threads on neighbouring chunks,
blockIdx.y over tiles of TILES rows. Each weight feeds every row of the tile and each x value every output of the
warp (OUTPUTS), so the multiply-adds and the loads of x decide the speed. x is laid out in *pair walk order*
(`walk_x`): one 8-byte load brings a thread two of its columns, and a warp's 32 loads are one coalesced 256-byte
line.

* a gated GEMV (the MLP's gate and up stacked, up to GATED_ROWS rows): each warp's outputs in pairs, a gate and
  its up (`slot_output`), writing SiLU(gate) * up (`swiglu`): no pass of its own for the MLP.
* stacked projections (qwen35.PROJECTIONS): each projection's outputs written whole (`output_index`).

Accumulators, held words and x values are local arrays of constant size indexed by unrolled loops, which the
compiler keeps in registers; each load's index is formed from a row offset found once; indices are unsigned (numba
checks a signed index for negative values); only the last chunk (cut short) checks its columns (`careful`), and
rows past a tile's last compute on its last row's x, unwritten. x is loaded as uint64: numba cannot prove the
16-byte alignment of a vector load.
"""
import numpy as np
from numba import cuda

from tensorfold.cuda.elementwise import launch_elementwise, silu_mul_kernel
from tensorfold.cuda.fmath import fma_rn, silu32, silu32_twin, tree_sum
from tensorfold.cuda.weights import CHUNK, bf16_format, f32_format, f32_from_bits
from tensorfold.device.grid import BLOCK, blocks_for, flat
from tensorfold.device.launch import kernel
from tensorfold.numerics.floats import add_rounded_once
from tensorfold.numerics.formats import bf16_to_f32

THREADS = 32  # threads per output (one warp): the walk's stride in chunks and the width of the reduction tree
TILE_ELEMENTS = 1 << 21  # the twin takes outputs in tiles of about this many weights or products (its memory)


def walk_order(in_features):
    """The columns in the order of the walk: round by round (THREADS chunks), step e of the round (column e of
    every chunk), thread by thread (thread t takes the round's chunk t)."""
    rounds = -(-in_features // (THREADS * CHUNK))
    columns = np.arange(rounds * THREADS * CHUNK).reshape(rounds, THREADS, CHUNK).transpose(0, 2, 1).ravel()
    return columns[columns < in_features]


def walked_weight(weight_rows, out_features, in_features):
    """The whole weight as the twin reads it: float64 [K, out_features], the columns in walk order (exact: float32
    values). A backend that keeps it (NumpyBackend) saves the twin dequantizing and reordering it on every call."""
    return np.asarray(weight_rows(np.arange(out_features)), np.float64).T[walk_order(in_features)]


def gemv(x, weight_rows, out_features, walked=None):
    """The twin: y[r, o] for every row of `x` [rows, K], reading weight rows through `weight_rows(outs)`, or, when
    given, from `walked` (the weight as `walked_weight` gives it: the same values).

    The twin takes a tile of outputs at a time (for memory), lays the columns out in walk order, forms a round's
    products at once (exact in float64) and runs the round's steps, each a few NumPy passes over (thread, row,
    output) that adds in float64 and rounds once to float32 (`add_rounded_once`): `fma_rn`.
    """
    rows, in_features = np.shape(x)
    order = walk_order(in_features)
    x64 = np.asarray(x, np.float64).T[order]  # [K, rows]: the columns in walk order
    y = np.empty((rows, out_features), np.float32)
    tile = max(1, TILE_ELEMENTS // max(rows * THREADS * CHUNK, in_features))
    for first in range(0, out_features, tile):
        outs = np.arange(first, min(first + tile, out_features))
        if walked is None:  # [K, outputs]: the tile's weights, dequantized once
            w64 = np.asarray(weight_rows(outs), np.float64).T[order]
        else:
            w64 = walked[:, first:first + len(outs)]
        partial = np.zeros((THREADS, rows, len(outs)), np.float32)  # one accumulator per (thread, row, output)
        for start in range(0, in_features, THREADS * CHUNK):  # a round: thread t takes chunk start / CHUNK + t
            stop = min(start + THREADS * CHUNK, in_features)
            products = x64[start:stop, :, None] * w64[start:stop, None, :]  # [columns, rows, outputs]
            begin = 0
            for e in range(CHUNK):  # step e: thread t takes column e of its chunk (threads past the end: nothing)
                live = -(-(stop - start - e) // CHUNK)
                add_rounded_once(products[begin:begin + live].reshape(-1), partial[:live].reshape(-1))
                begin += live
        y[:, outs] = tree_sum(np.moveaxis(partial, 0, -1))
    return y


def gemv_f32(x, weight):
    """y = x @ weight.T for a float32 weight [out, K]."""
    return gemv(x, lambda outs: weight[outs], weight.shape[0])


def gemv_bf16(x, weight_bits):
    """y = x @ weight.T for a bf16 weight stored as uint16 bit patterns [out, K]."""
    return gemv(x, lambda outs: bf16_to_f32(weight_bits[outs]), weight_bits.shape[0])


def swiglu(y):
    """SiLU(gate) * up for the outputs y [rows, 2 n] of a GEMV over a weight of n gate rows, then n up rows (the
    SwiGLU MLP's gate_proj and up_proj stacked): what a gated GEMV kernel writes (`launch_gemv`'s `gated`), every
    output's sum computed as the GEMV computes it and multiplied where it is written."""
    half = y.shape[1] // 2
    return silu32_twin(y[:, :half]) * y[:, half:]


# --- the kernels: the twin's walk, output by output (see the module's docstring) -----------------------------------

OUTPUTS = 2  # outputs a warp of the tile kernel computes: each x load feeds both
TILES = (1, 4, 8)  # rows a block of the tile kernel holds: the least that holds a call's rows, 8 past that
GATED_ROWS = 4  # rows up to which a gated call's kernel writes SiLU(gate) * up (gated, 8-row tiles pass 128 registers)
WARPS = 4  # warps a block
ROUND = THREADS * CHUNK  # columns in a round of the walk: THREADS chunks, one a thread
ROUND_PAIRS = ROUND // 2  # pairs of them


@cuda.jit(device=True)
def walk_column(p):
    """The column at position p of the pair walk order: in its round of THREADS * CHUNK positions, pair
    q = p // 2 belongs to thread q % THREADS and holds its columns 2 * (q // THREADS) and the one after."""
    round_start = p // (THREADS * CHUNK) * THREADS * CHUNK
    pair = p % (THREADS * CHUNK) // 2
    return round_start + pair % THREADS * CHUNK + pair // THREADS * 2 + p % 2


def walk_x(x, tile):
    """The twin of `walk_x_kernel`: x [rows, K] in pair walk order, by tiles of `tile` rows: float32 [tiles,
    rounds, tile, ROUND], where [T, R, r] is row T * tile + r's round R (its columns R * ROUND onwards in pair walk
    order). Positions past the last column, and rows past the last, hold zero. Tiles of one row are x row by row."""
    rows, columns = np.shape(x)
    tiles, rounds = -(-rows // tile), -(-columns // ROUND)
    column = walk_column.py_func(np.arange(rounds * ROUND))
    padded = np.zeros((tiles * tile, columns + 1), np.float32)  # column `columns` and the rows past the last: zero
    padded[:rows, :columns] = x
    walked = padded[:, np.minimum(column, columns)]  # [tiles * tile, rounds * ROUND]
    return walked.reshape(tiles, tile, rounds, ROUND).transpose(0, 2, 1, 3).copy()


@kernel
def walk_x_kernel(x, tile, out):
    """Thread (p, row): position p of row `row`'s walk (a row of the tiles, those past x's last included). The
    position's divisions are by the constant ROUND (shifts): a division by a size known only at run time costs tens
    of instructions."""
    p, row = cuda.grid(1), cuda.blockIdx.y
    if p < out.shape[1] * ROUND:
        column = walk_column(p)
        inside = row < x.shape[0] and column < x.shape[1]
        out[row // tile, p // ROUND, row % tile, p % ROUND] = x[row, column] if inside else np.float32(0)


PARTS = 4  # parts a GEMV's outputs can be cut into (qwen35.PROJECTIONS: at most four projections stacked)


@cuda.jit(device=True)
def output_index(r, o, rows, out_features, end1, end2, end3):
    """Where output o of row r goes in the flat y: the outputs are cut into up to PARTS parts that end at end1,
    end2, end3 (out_features where there are fewer parts) and out_features, and each part is stored whole,
    [rows, its width] row by row, after the parts before it. One part is y [rows, out_features] as usual."""
    start, end = 0, end1
    if o >= end1:
        start, end = end1, end2
    if o >= end2:
        start, end = end2, end3
    if o >= end3:
        start, end = end3, out_features
    return start * rows + r * (end - start) + o - start


@cuda.jit(device=True)
def warp_outputs(warp, per_warp, out_features, gated):
    """(the warp's first output, how many outputs there are) for warp number `warp` of per_warp outputs each; gated,
    the warp's first pair and the count of pairs (a gated GEMV's out_features are gates, then as many ups)."""
    if gated:
        return warp * (per_warp // 2), out_features // 2
    return warp * per_warp, out_features


@cuda.jit(device=True)
def slot_output(base, j, count, gated):
    """The output of the warp's slot j (past the last: the last): base + j; gated, slot 2 i holds pair base + i's
    gate, output base + i, and slot 2 i + 1 its up, `count` outputs later."""
    if gated:
        return min(base + j // 2, count - 1) + j % 2 * count
    return min(base + j, count - 1)


def tree_writer(rows, outputs, gated=False):
    """The end of both kernels: each sum's THREADS partial sums (acc[r * outputs + j] of every thread of the warp)
    added in the halving tree of `tree_sum`, and written to y (see `output_index`) for the `live` rows from `first`;
    `gated` (the warp's outputs in pairs, a gate and its up): SiLU(gate) * up written for each pair instead, to
    y [rows, pairs], where `base` is the warp's first pair and `out_features` the count of pairs.
    The rows * outputs trees go up a level at a time together, so the block waits at one barrier a level, not one a
    level for each sum; then thread t of the warp writes sum t, one write, all a warp of 32 needs (no loop over
    sums t, t + THREADS, ...). `partial` is shared [WARPS, rows * outputs, THREADS]."""
    sums = rows * outputs
    written = sums // 2 if gated else sums  # values the warp writes
    assert written <= 2 * THREADS, "a thread writes at most two values"
    pairs = outputs // 2

    @cuda.jit(device=True)
    def write_sum(partial, warp, a, base, first, live, y, rows_total, out_features, end1, end2, end3):
        if gated:  # pair a: row r, the warp's pair j, whose gate is sum r * outputs + 2 j and whose up the next
            r, j = a // pairs, a % pairs
            if a < written and r < live and base + j < out_features:
                gate, up = partial[warp, r * outputs + 2 * j, 0], partial[warp, r * outputs + 2 * j + 1, 0]
                y[np.uint64((first + r) * out_features + base + j)] = silu32(gate) * up
        else:
            r, j = a // outputs, a % outputs  # sum a: row r, output base + j
            if a < sums and r < live and base + j < out_features:
                at = output_index(first + r, base + j, rows_total, out_features, end1, end2, end3)
                y[np.uint64(at)] = partial[warp, a, 0]

    @cuda.jit(device=True)
    def write_sums(acc, partial, warp, t, base, first, live, y, rows_total, out_features, end1, end2, end3):
        for a in range(sums):
            partial[warp, a, t] = acc[a]
        width = THREADS // 2
        while width > 0:  # shared memory and syncthreads: the simulator has no warp shuffles
            cuda.syncthreads()
            if t < width:  # a thread a sum: sharing a level's additions out over more threads is more integer work
                for a in range(sums):
                    partial[warp, a, t] += partial[warp, a, t + width]
            width //= 2
        cuda.syncthreads()
        write_sum(partial, warp, t, base, first, live, y, rows_total, out_features, end1, end2, end3)
        if written > THREADS:  # a warp of fewer threads than values (the simulator's 8): a second one a thread
            write_sum(partial, warp, t + THREADS, base, first, live, y, rows_total, out_features, end1, end2, end3)
    return write_sums


def gemv_kernel(weight_format, rows, per_warp, gated=False):
    """The tile kernel for one `WeightFormat`, `rows` rows a block and `per_warp` outputs a warp (`gated`: pairs of
    outputs, see `slot_output`); x in pair walk order, as uint64, row by row (`walk_x` with tiles of one row). The
    local arrays' sizes are constants of the closure, as numba needs."""
    hold, weight = weight_format.hold, weight_format.weight
    accumulators, pair_values = rows * per_warp, 2 * rows
    held_words, held_floats = per_warp * weight_format.words, per_warp * weight_format.floats
    write_sums = tree_writer(rows, per_warp, gated)

    @kernel
    def gemv_tile_kernel(x_pairs, rounds, columns, data, width, y, rows_total, out_features, end1, end2, end3):
        warp, t, first = cuda.threadIdx.x // THREADS, cuda.threadIdx.x % THREADS, cuda.blockIdx.y * rows
        base, count = warp_outputs(cuda.blockIdx.x * WARPS + warp, per_warp, out_features, gated)
        live = min(rows, rows_total - first)  # the tile's rows
        acc = cuda.local.array(accumulators, np.float32)  # acc[r * per_warp + j]: row r, output base + j
        words = cuda.local.array(held_words, np.uint32)  # the chunk of each output, as stored
        floats = cuda.local.array(held_floats, np.float32)
        xs = cuda.local.array(pair_values, np.float32)  # xs[2 * r + e % 2]: row r's pair of columns
        weight_rows = cuda.local.array(per_warp, np.uint64)  # where each output's row starts in `data`
        x_rows = cuda.local.array(rows, np.int64)  # where each row starts (past live: the last)
        for a in range(accumulators):
            acc[a] = 0
        for j in range(per_warp):
            output = np.uint64(slot_output(base, j, count, gated))
            weight_rows[j] = output * np.uint64(width)
        for r in range(rows):
            x_rows[r] = (first + min(r, live - 1)) * rounds * ROUND_PAIRS
        if base < count:  # a warp past the last output only joins the tree
            chunks = -(-columns // CHUNK)
            interior = columns // CHUNK  # the chunks before this one are whole
            for c in range(t, chunks, THREADS):
                careful = c >= interior  # a chunk cut short: check its columns
                for j in range(per_warp):
                    hold(data, weight_rows[j], np.uint64(c), columns, words, floats, j, careful)
                round_pairs = np.uint64((c - t) * (CHUNK // 2))  # where the chunk's round starts in a row
                for e in range(CHUNK):
                    if e % 2 == 0:  # columns e and e + 1 of each row, one load (zero past the last column)
                        for r in range(rows):
                            pair = x_pairs[np.uint64(x_rows[r] + round_pairs + e // 2 * THREADS + t)]
                            xs[2 * r] = f32_from_bits(np.uint32(pair & np.uint64(0xFFFFFFFF)))  # the first: low half
                            xs[2 * r + 1] = f32_from_bits(np.uint32(pair >> np.uint64(32)))
                    if not careful or c * CHUNK + e < columns:
                        for j in range(per_warp):
                            w = weight(words, floats, j, e)  # converted here, used by every row of the tile
                            for r in range(rows):
                                acc[r * per_warp + j] = fma_rn(w, xs[2 * r + e % 2], acc[r * per_warp + j])
        partial = cuda.shared.array((WARPS, accumulators, THREADS), np.float32)
        write_sums(acc, partial, warp, t, base, first, live, y, rows_total, count, end1, end2, end3)

    return gemv_tile_kernel


class GemvKernels:
    """One weight format's GEMV kernels, compiled on first use: a tile kernel per tile of TILES and gating."""

    def __init__(self, weight_format):
        self.weight_format = weight_format  # () -> the format's WeightFormat
        self.shapes = {}  # (rows a block holds, gated) -> its kernel

    def for_call(self, rows, gated=False):
        """(rows a block holds, the kernel) for a call of `rows` rows; `gated`: the kernel that writes
        SiLU(gate) * up (see `launch_gemv`)."""
        tile = min((tile for tile in TILES if tile >= rows), default=max(TILES))  # the least that holds them
        key = (tile, gated)
        if key not in self.shapes:
            self.shapes[key] = gemv_kernel(self.weight_format(), tile, OUTPUTS, gated)
        return tile, self.shapes[key]


gemv_f32_kernel = GemvKernels(f32_format)
gemv_bf16_kernel = GemvKernels(bf16_format)


def launch_walk_x(x, tile, stream=0):
    """x [rows, K] on the device in pair walk order by tiles of `tile` rows (see `walk_x`), float32."""
    tiles, rounds = -(-x.shape[0] // tile), -(-x.shape[1] // ROUND)
    out = cuda.device_array((tiles, rounds, tile, ROUND), np.float32, stream=stream)
    walk_x_kernel[(blocks_for(rounds * ROUND), tiles * tile), BLOCK, stream](x, tile, out)
    return out


def launch_gemv(kernels, x, out_features, weight, stream=0, parts=None, gated=False):
    """Run a format's GEMV (`kernels`: gemv_f32_kernel or gemv_bf16_kernel) over the rows of the device array x.
    Returns y [rows, out_features]; with `parts` (up to PARTS widths that add up to out_features), a list of one
    array [rows, width] per part, each a contiguous piece of one output (no copy, whatever the row count); `gated`
    (a weight of gate rows, then as many up rows), SiLU(gate) * up [rows, out_features / 2] (`swiglu`)."""
    if gated and x.shape[0] > GATED_ROWS:  # the GEMV in two parts, gate and up, then their product
        gate, up = launch_gemv(kernels, x, out_features, weight, stream=stream, parts=[out_features // 2] * 2)
        return launch_elementwise(silu_mul_kernel, gate, up, stream=stream)
    widths = [out_features] if parts is None else list(parts)
    assert 1 <= len(widths) <= PARTS and sum(widths) == out_features, f"parts {widths} of {out_features} outputs"
    ends = [int(e) for e in np.cumsum(widths)[:-1]] + [out_features] * (PARTS - len(widths))
    assert not gated or (parts is None and out_features % 2 == 0), "a gated GEMV has a gate for every up"
    rows = x.shape[0]
    tile, kernel_for_call = kernels.for_call(rows, gated)
    y = cuda.device_array(rows * out_features // (2 if gated else 1), np.float32, stream=stream)
    blocks = -(-out_features // (WARPS * OUTPUTS))
    walked = launch_walk_x(x, 1, stream)  # read as uint64: two columns a load
    kernel_for_call[(blocks, -(-rows // tile)), WARPS * THREADS, stream](
        flat(walked).view(np.uint64), walked.shape[1], x.shape[1], flat(weight), weight.shape[1], y, rows,
        out_features, *ends)
    if parts is None:
        return y.reshape(rows, y.size // rows)
    starts = [0] + ends[:len(widths) - 1]
    return [y[start * rows:(start + width) * rows].reshape(rows, width) for start, width in zip(starts, widths)]
