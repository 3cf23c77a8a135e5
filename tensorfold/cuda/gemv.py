"""GEMV over a round's rows: y[r, o] = sum_k W[o, k] * x[r, k], for float32, bf16 and MLX affine 4/8-bit weights.

The order of the sums: the columns are cut into chunks of CHUNK = 8 (one uint32 of 4-bit codes), and each output
has THREADS = 32 threads. Thread t walks the chunks t, t + THREADS, t + 2 * THREADS, ..., each chunk's columns in
order, adding `fma_rn(w, x, acc)` (one float32 rounding, fmath.py) into one float32 accumulator per row; then
the THREADS partial sums are added in the halving tree of `tree_sum`. The order depends only on K, never on how
many rows the round has, so a prompt of 300 rows and 300 one-row steps give the same bits; and it is the same for
every weight format, so a bf16 or 4-bit weight gives the bits of its float32 values.

The twin, `gemv`, runs the walk in rounds of THREADS chunks and steps e = 0 .. CHUNK - 1: at step e of round j
thread t takes column (j * THREADS + t) * CHUNK + e (threads past the last column add nothing). Each step is a
few NumPy passes vectorised over (thread, row, output); `walk_order` lays the columns out so that a step's are
neighbours.

The kernels (the section "the kernels" below has the details and the measurements behind them): a block has
WARPS = 4 warps, each output THREADS = 32 threads (a warp). A GEMV is bound by how fast it moves weights and x
through the SM, and the mapping is chosen for it:

* one row (a decode step, affine weights): `affine_row_kernel`, a warp computes 4 outputs (2 in a call of few
  warps), each x value it loads feeds them all, and it loads 4 chunks of each output (8 of 2) before it multiplies
  any, so 16 words of codes are in flight; each weight is dequantized where it is used, once;
* several rows: `gemv_kernel`, blockIdx.y runs over tiles of 4 or 8 rows and a warp computes 2 outputs (4 in a call
  with warps to spare), so each dequantized weight feeds every row of the tile and each x value every output; x is
  laid out in *pair walk order* (`walk_x`), so that one 8-byte load brings a thread two of its columns and a warp's
  32 loads are one coalesced 256-byte line; in a wide call of 8-row tiles, by tiles, so that every load of x sits
  at a constant offset from one index, and the registers that saves hold the next chunk's codes, loaded ahead;
* a gated GEMV (the MLP's gate and up stacked, up to GATED_ROWS rows): either kernel with each warp's outputs in
  pairs, a gate and its up, writing SiLU(gate) * up (`swiglu`), so the MLP's hidden values take no pass of their own;
* coalesced loads: the threads of a warp take neighbouring chunks, so one load instruction of 4-bit codes covers
  128 contiguous bytes (a word per thread), and a chunk's 8 loads of bf16 cover 512;
* registers: accumulators, held words, weights and x values are local arrays of constant size indexed by unrolled
  loops, which the compiler keeps in registers;
* the THREADS partial sums of an output are added once, after the walk, within its warp; the trees of all the
  warp's sums go up a level at a time together, one barrier a level.

A load is one element (a word of codes, a bf16, a float32) or, for x, one uint64: numba cannot prove the 16-byte
alignment a vector load needs. The tree goes through shared memory with syncthreads: numba's CUDA simulator has
no warp shuffles and no syncwarp.

Weights are dequantized inside the loop, each where it is multiplied, and never materialised:

* bf16: the 16 stored bits are the top half of the float32 (`bits << 16`), exact.
* affine (MLX): column `k` of output `o` is `fma_rn(scales[o, g], q, biases[o, g])` with `g = k // group_size` and
  the code `q` taken from the packed uint32 word `k // (32 // bits)` at bit offset `bits * (k % (32 // bits))`
  (element 0 in the lowest bits). MLX's group sizes (32, 64, 128) are multiples of CHUNK, so a chunk has one
  scale and one bias.
"""
import collections

import numpy as np
from numba import cuda

from tensorfold.contract import KernelCheck
from tensorfold.contract.controls import drop_row, swap_rows
from tensorfold.cuda.elementwise import launch_elementwise, silu_mul_kernel
from tensorfold.cuda.fmath import fma_rn, silu32, silu32_twin, tree_sum
from tensorfold.device.grid import BLOCK, blocks_for, flat, to_host
from tensorfold.device.launch import kernel
from tensorfold.numerics.floats import add_rounded_once
from tensorfold.numerics.formats import affine_rows, bf16_to_f32, f32_to_bf16

THREADS = 32  # threads per output (one warp): the walk's stride in chunks and the width of the reduction tree
CHUNK = 8  # columns a thread takes at a time: one uint32 of 4-bit codes, two of 8-bit, 16 bytes of bf16
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


def gemv_affine(x, packed, scales, biases, bits, group_size):
    """y = x @ W.T for an MLX affine weight: packed uint32 [out, K * bits / 32], float32 scales and biases [out, K / gs]."""
    return gemv(x, lambda outs: affine_rows(packed, scales, biases, bits, group_size, outs), packed.shape[0])


def swiglu(y):
    """SiLU(gate) * up for the outputs y [rows, 2 n] of a GEMV over a weight of n gate rows, then n up rows (the
    SwiGLU MLP's gate_proj and up_proj stacked): what a gated GEMV kernel writes (`launch_gemv`'s `gated`), which
    computes every output's sum as the GEMV does and multiplies where it writes, so the MLP's hidden values take no
    launch and no pass of their own."""
    half = y.shape[1] // 2
    return silu32_twin(y[:, :half]) * y[:, half:]


# --- the kernels --------------------------------------------------------------------------------------------------
# Every kernel runs the twin's walk, output by output: thread t of a warp walks the chunks t, t + THREADS, ... of
# each of its outputs, each chunk's columns in order, and at the end the warp adds the THREADS partial sums of each
# output in the halving tree. There are two kernels, because one row and several rows are bound by different work:
#
# * One row (`affine_row_kernel`, for the affine formats of a decode round): each weight is used once, so the
#   kernel's job is to keep loads of codes in flight. A warp computes ROW_OUTPUTS = 4 outputs (each x value it
#   loads feeds four) and loads ROW_STEP = 4 chunks of each before it multiplies: 16 words of codes, with their
#   scales and biases, held as stored and dequantized where each weight is used. A call of fewer than
#   ROW_WIDE_WARPS such warps (the 2B's 2,048- and 6,144-output projections) takes NARROW_OUTPUTS = 2 outputs and
#   NARROW_STEP = 8 chunks: as many loads in flight a warp, and twice the warps. Measured with every call reading
#   weights no earlier call left in L2, as in a decode round: 2,048 x 6,144 went from 19.7 to 11.1 us, 2,048 x
#   2,048 from 9.1 to 6.0, 6,144 x 2,048 from 10.2 to 8.5; 12,288 x 2,048 took 12.6 us with 4 outputs a warp, 14.2
#   with 2, and the head 172 against 191. (Timed on weights left in L2 by the call before, the small calls had
#   looked best with 4 outputs: 5.9 against 6.1 us for 2,048 x 2,048.) x is read as it is, two columns a uint64
#   load: one row of x stays in L1. A float weight's one-row call takes the tile kernel with a tile of one row.
# * Several rows (`gemv_kernel`, tiles of 4 or 8 rows; blockIdx.y runs over the tiles): each dequantized weight
#   feeds every row of the tile, so the multiply-adds and the loads of x decide the speed. A warp computes OUTPUTS = 2
#   outputs and takes one chunk a step: it holds the chunk of each output as stored (the format's `hold`), then for each
#   pair of columns loads the tile's x values, and for each column dequantizes the outputs' weights (`weight`) and makes
#   the multiply-adds. An affine call whose warps would still number WIDE_WARPS at WIDE_OUTPUTS = 4 outputs a warp takes
#   4: each x load then feeds twice the multiply-adds, and the call has warps enough to keep the SMs busy with half as
#   many (at 16 rows the head went from 1,096 to 1,015 us, the 2B's 12,288 x 2,048 from 59.5 to 58.0; 2,048 x 6,144,
#   which would have 1,024 warps, from 31.3 to 37.6, so it keeps 2; at 128 rows every 2B projection gained 3 to 8 %).
#   (Dequantizing the whole chunk into CHUNK floats an output first took 6 to 14 % longer at 16 rows:
#   docs/receipts/2026-11-30-h200-chains.md, section 2.) x is laid out in *pair walk order* (`walk_x`, one small launch
#   per GEMV): a thread's columns e and e + 1 are neighbours, and neighbouring threads' pairs are neighbours, so one
#   8-byte load (x viewed as uint64) brings two columns, and a warp's 32 loads are one coalesced 256-byte line. Half the
#   load instructions of one float at a time: at 16 rows the kernel took 38 to 55 % less time
#   (docs/receipts/2026-11-30-h200-stacked.md, section 1).
# * x by tiles, and the next chunk ahead (a wide call with tiles of 8 rows: `x_layout_tile`): walk_x puts a round of
#   the tile's 8 rows side by side ([tile, round, row, position]), so that row r's pair of a chunk is a constant
#   offset from one index a chunk, and the loads need no address of their own (each row's was a 64-bit add a chunk).
#   That frees 22 registers (128 to 106 with ptxas 12.9), which hold the next chunk's codes, scale and bias, loaded
#   while this chunk is multiplied (124 registers). Timed cold at 16 rows: the head 1,005.5 to 935.0 us, 12,288 x
#   2,048 58.3 to 56.4; at 128 rows 12,288 x 2,048 397.0 to 368.1, and every 2B projection 5 to 10 % faster
#   (docs/receipts/2026-12-01-h200-ahead.md). The other calls keep x row by row and load each chunk where it is used:
#   with 2 outputs a warp the same change took 15 to 20 % longer (2,048 x 6,144 at 16 rows: 40.2 against 33.7 us;
#   with registers to spare the compiler spread the x loads among the multiply-adds, and these calls have no warps
#   to spare to hide the wait), and with tiles of 4 rows the 4-row head took 310.7 against 301.0.
#
# Both kernels end in `tree_writer`'s sums, written where `output_index` says: y [rows, out_features], or, for a
# GEMV over stacked projections (qwen35.PROJECTIONS), each projection's outputs as a whole [rows, width] array of
# their own, one after another in the same buffer, so that nothing has to copy them apart.
#
# A gated GEMV (the MLP's gate and up projections stacked, `swiglu`) takes its warps' outputs in pairs, a gate and
# its up (`slot_output`), and writes SiLU(gate) * up: one launch and one pass fewer for the MLP's hidden values.
# At 1 row a 12,288 x 2,048 call went from 15.0 us (the GEMV, then `silu_mul`) to 12.7, at 4 rows from 27.7 to
# 25.8. Tiles of 8 rows gated need 130 registers, not 128, which costs a block an SM: 64.8 against 61.6 us at
# 16 rows, 463.8 against 403.2 at 128; so a call of more than GATED_ROWS rows runs the GEMV, then `silu_mul`.
#
# The accumulators, held words, weights and x values are local arrays of constant size indexed by unrolled loops,
# which the compiler keeps in registers (a size only known at run time puts them in local memory; so does an array
# too large to unroll over: tiles of 4 outputs spilled while chunks were dequantized into CHUNK floats an output).
#
# The arithmetic is a few multiply-adds per load, so the integer work around it decides the speed (a first version
# spent about 20 instructions per multiply-add, most of them index arithmetic, and took twice as long):
# * the arrays come in flat, and each load's index is formed from a row offset computed once per thread;
# * indices are unsigned (`np.uint64(...)`): numba fixes up every signed index for negative values, a compare and
#   a select per dimension of every load, and these never are negative;
# * a format's constants (the bits of a code, the group size) are constants of the kernel, so a code's shift and
#   a chunk's group are shifts by constants, not divisions;
# * the interior steps, whose columns all exist, check no column (`careful` is false); only the last steps (a chunk
#   cut short, a chunk past the last one) check each. Rows past the tile's last are computed on its last row's x
#   and never written, so no multiply-add waits on a check of its row.

OUTPUTS = 2  # outputs a warp of the tile kernel computes: each x load feeds both
WIDE_OUTPUTS = 4  # outputs a warp of an affine call that has warps to spare
WIDE_WARPS = 4096  # the warps such a call has at WIDE_OUTPUTS outputs a warp, at least (31 an SM of an H200)
TILES = (1, 4, 8)  # rows a block of the tile kernel holds: the least that holds a call's rows, 8 past that
ROW_OUTPUTS = 4  # outputs a warp of the one-row kernel computes, in a call of ROW_WIDE_WARPS warps or more
ROW_STEP = 4  # chunks of each output it then loads before it multiplies
ROW_WIDE_WARPS = 2048  # warps at ROW_OUTPUTS a warp from which a one-row call takes that shape (8,192 outputs)
NARROW_OUTPUTS = 2  # outputs a warp and chunks a step of a one-row call with fewer warps: twice the warps, and as
NARROW_STEP = 8  # many loads in flight a warp
GATED_ROWS = 4  # rows up to which a gated call's kernel writes SiLU(gate) * up itself (see `launch_gemv`)
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


def x_layout_tile(rows, per_warp):
    """The tiles `walk_x` lays x out in for a tile kernel of `rows` rows and `per_warp` outputs a warp: a wide
    call's in tiles of 8 rows (WIDE_OUTPUTS, the largest of TILES) by its tiles, any other row by row (tiles of one
    row). See "x by tiles" below for what was measured."""
    return rows if per_warp == WIDE_OUTPUTS and rows == max(TILES) else 1


@cuda.jit(device=True)
def f32_from_bits(bits):
    """The float32 with these 32 bits (uint32): exact, and the same in the simulator (no bit-cast needed)."""
    word = cuda.local.array(1, np.uint32)
    word[0] = bits
    return word.view(np.float32)[0]


@cuda.jit(device=True)
def bf16_bits_to_f32(bits):
    """The float32 whose top half is `bits` (bf16): exact."""
    return f32_from_bits(np.uint32(bits) << 16)


# The weight formats of the tile kernel. A format says what a warp holds of a chunk as stored (`hold`) and how
# column e's float32 weight comes out of it (`weight`): a weight is dequantized where the kernel multiplies it, once
# a tile, and a chunk of 4-bit codes costs one word and a scale and bias in registers, not CHUNK floats an output.
# `*_format(bits, group_size)` builds a format's pair with its constants and returns a `WeightFormat`:
# `hold(data, scales, biases, row, group_row, chunk, columns, words, floats, j, careful)` puts an output's chunk into
# words[j * WORDS:] (uint32) and floats[j * FLOATS:] (float32); `weight(words, floats, j, e)` is column e's weight.
# `data` is the flat weight, the output's row starting at `row`; `scales` and `biases` are flat [out * groups], its
# groups starting at `group_row` (the float formats ignore them); `row`, `group_row` and `chunk` are unsigned (the
# kernel finds an output's rows once, and a chunk's group is then a shift). `careful`: the chunk may reach past the
# last column, whose weight is then reloaded (nothing adds it).
# `whole_chunks`: the format's column counts are multiples of CHUNK, so its kernels compile without any check.

WeightFormat = collections.namedtuple("WeightFormat", "words floats hold weight whole_chunks")


def f32_format(bits, group_size):
    """float32 as stored: the chunk's CHUNK floats."""
    @cuda.jit(device=True)
    def hold(weight, scales, biases, row, group_row, chunk, columns, words, floats, j, careful):
        for e in range(CHUNK):
            column = chunk * np.uint64(CHUNK) + np.uint64(e)
            if careful:
                column = min(column, np.uint64(columns - 1))
            floats[j * CHUNK + e] = weight[row + column]

    @cuda.jit(device=True)
    def weight(words, floats, j, e):
        return floats[j * CHUNK + e]
    return WeightFormat(1, CHUNK, hold, weight, whole_chunks=False)  # (its one word a chunk unused)


def bf16_format(bits, group_size):
    """bf16: the chunk's CHUNK stored 16 bits, each widened to float32 where it is used, exactly."""
    @cuda.jit(device=True)
    def hold(weight_bits, scales, biases, row, group_row, chunk, columns, words, floats, j, careful):
        for e in range(CHUNK):
            column = chunk * np.uint64(CHUNK) + np.uint64(e)
            if careful:
                column = min(column, np.uint64(columns - 1))
            words[j * CHUNK + e] = weight_bits[row + column]

    @cuda.jit(device=True)
    def weight(words, floats, j, e):
        return bf16_bits_to_f32(words[j * CHUNK + e])
    return WeightFormat(CHUNK, 1, hold, weight, whole_chunks=False)


def affine_format(bits, group_size):
    """MLX affine: the chunk's words of codes (1 for 4-bit, 2 for 8-bit) and its group's scale and bias; column e's
    weight is fma_rn(scale, code, bias) (a code is a small integer: exact as float32). A group size is a multiple
    of CHUNK, so a chunk has one group and never reaches past the last column."""
    words_a_chunk, per_word, mask = CHUNK * bits // 32, 32 // bits, np.uint32((1 << bits) - 1)
    chunks_per_group = group_size // CHUNK

    @cuda.jit(device=True)
    def hold(packed, scales, biases, row, group_row, chunk, columns, words, floats, j, careful):
        g = group_row + chunk // np.uint64(chunks_per_group)
        floats[2 * j], floats[2 * j + 1] = scales[g], biases[g]
        for w in range(words_a_chunk):
            words[j * words_a_chunk + w] = packed[row + chunk * np.uint64(words_a_chunk) + np.uint64(w)]

    @cuda.jit(device=True)
    def weight(words, floats, j, e):  # element e of a word sits at bit bits * e
        code = (words[j * words_a_chunk + e // per_word] >> np.uint32(bits * (e % per_word))) & mask
        return fma_rn(floats[2 * j], np.float32(code), floats[2 * j + 1])
    return WeightFormat(words_a_chunk, 2, hold, weight, whole_chunks=True)


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
    level for each sum (a tile of 8 rows and 2 outputs waited at 14 barriers, now at 6: at 16 rows the kernel took
    10 to 19 % less time); thread t of the warp then writes sum t. (A loop over sums t, t + THREADS, ... took 11 to
    17 % longer at 16 rows than this one write, which the GPU's warps of 32 always need.) `partial` is shared
    [WARPS, rows * outputs, THREADS]."""
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
            if t < width:  # (sharing a level's additions out over all the threads was slower: integer work)
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
    outputs, see `slot_output`); x in pair walk order, as uint64, in the tiles of `x_layout_tile`: by the kernel's
    tiles in a wide call of 8 rows (which also loads each chunk of codes a step ahead), else row by row. The local
    arrays' sizes are constants of the closure, as numba needs."""
    hold, weight, whole_chunks = weight_format.hold, weight_format.weight, weight_format.whole_chunks
    accumulators, pair_values = rows * per_warp, 2 * rows
    held_words, held_floats = per_warp * weight_format.words, per_warp * weight_format.floats
    write_sums = tree_writer(rows, per_warp, gated)
    by_tiles = x_layout_tile(rows, per_warp) == rows  # x's rows side by side a round, and the next chunk ahead
    tile_round = rows * ROUND_PAIRS  # by tiles: pairs in a round of the tile's rows

    @kernel
    def gemv_tile_kernel(x_pairs, rounds, columns, data, width, scales, biases, groups, y, rows_total,
                         out_features, end1, end2, end3):
        warp, t, first = cuda.threadIdx.x // THREADS, cuda.threadIdx.x % THREADS, cuda.blockIdx.y * rows
        base, count = warp_outputs(cuda.blockIdx.x * WARPS + warp, per_warp, out_features, gated)
        live = min(rows, rows_total - first)  # the tile's rows
        acc = cuda.local.array(accumulators, np.float32)  # acc[r * per_warp + j]: row r, output base + j
        words = cuda.local.array(held_words, np.uint32)  # the chunk of each output, as stored
        floats = cuda.local.array(held_floats, np.float32)
        ahead_words = cuda.local.array(held_words, np.uint32)  # by tiles: the next chunk of each output, loaded
        ahead_floats = cuda.local.array(held_floats, np.float32)  # while this one is multiplied
        xs = cuda.local.array(pair_values, np.float32)  # xs[2 * r + e % 2]: row r's pair of columns
        weight_rows = cuda.local.array(per_warp, np.uint64)  # where each output's row starts in `data`
        group_rows = cuda.local.array(per_warp, np.uint64)  # and its scales and biases (past the last: the last)
        x_rows = cuda.local.array(rows, np.int64)  # row by row: where each row starts (past live: the last)
        for a in range(accumulators):
            acc[a] = 0
        for j in range(per_warp):
            output = np.uint64(slot_output(base, j, count, gated))
            weight_rows[j], group_rows[j] = output * np.uint64(width), output * np.uint64(groups)
        if not by_tiles:
            for r in range(rows):
                x_rows[r] = (first + min(r, live - 1)) * rounds * ROUND_PAIRS
        if base < count:  # a warp past the last output only joins the tree
            chunks = -(-columns // CHUNK)
            interior = columns // CHUNK  # the chunks before this one are whole
            if by_tiles and t < chunks:
                for j in range(per_warp):
                    hold(data, scales, biases, weight_rows[j], group_rows[j], np.uint64(t), columns, ahead_words,
                         ahead_floats, j, not whole_chunks and t >= interior)
            for c in range(t, chunks, THREADS):
                careful = not whole_chunks and c >= interior  # a chunk cut short: check its columns
                if by_tiles:  # this chunk came ahead; the next one's loads go out now
                    for i in range(held_words):
                        words[i] = ahead_words[i]
                    for i in range(held_floats):
                        floats[i] = ahead_floats[i]
                    following = c + THREADS
                    if following < chunks:
                        for j in range(per_warp):
                            hold(data, scales, biases, weight_rows[j], group_rows[j], np.uint64(following), columns,
                                 ahead_words, ahead_floats, j, not whole_chunks and following >= interior)
                    round_pairs = np.uint64((cuda.blockIdx.y * rounds + c // THREADS) * tile_round + t)  # thread t's
                else:
                    for j in range(per_warp):
                        hold(data, scales, biases, weight_rows[j], group_rows[j], np.uint64(c), columns, words, floats,
                             j, careful)
                    round_pairs = np.uint64((c - t) * (CHUNK // 2))  # where the chunk's round starts in a row
                for e in range(CHUNK):
                    if e % 2 == 0:  # columns e and e + 1 of each row, one load (zero past the last column)
                        for r in range(rows):
                            if by_tiles:  # at a constant offset from the chunk's index
                                at = round_pairs + np.uint64(r * ROUND_PAIRS + e // 2 * THREADS)
                            else:
                                at = np.uint64(x_rows[r] + round_pairs + e // 2 * THREADS + t)
                            pair = x_pairs[at]
                            xs[2 * r] = f32_from_bits(np.uint32(pair & np.uint64(0xFFFFFFFF)))  # the first: low half
                            xs[2 * r + 1] = f32_from_bits(np.uint32(pair >> np.uint64(32)))
                    if not careful or c * CHUNK + e < columns:
                        for j in range(per_warp):
                            w = weight(words, floats, j, e)  # dequantized here, used by every row of the tile
                            for r in range(rows):
                                acc[r * per_warp + j] = fma_rn(w, xs[2 * r + e % 2], acc[r * per_warp + j])
        partial = cuda.shared.array((WARPS, accumulators, THREADS), np.float32)
        write_sums(acc, partial, warp, t, base, first, live, y, rows_total, count, end1, end2, end3)

    return gemv_tile_kernel


def affine_row_kernel(bits, group_size, outputs_a_warp=ROW_OUTPUTS, chunks_a_step=ROW_STEP, gated=False):
    """The one-row kernel for an affine format: each warp's `outputs_a_warp` outputs, `chunks_a_step` chunks of each
    loaded as stored (codes, scale, bias) before any is used, each weight dequantized with fma_rn(scale, code, bias)
    where it is multiplied. Affine weights have whole chunks (the column count is a multiple of the group size).

    The loop is all loads, conversions and multiply-adds: each output's first word of codes and first group are
    found once (`code_rows`, `group_rows`), so that a step's loads sit at constant offsets from one index an output,
    and the steps whose chunks all exist (`step` with `careful` false) check nothing; the last step, which may
    reach past the last chunk, is the same code with the checks (`careful` true, a constant the compiler folds)."""
    words, per_word, mask = CHUNK * bits // 32, 32 // bits, np.uint32((1 << bits) - 1)
    chunks_per_group = group_size // CHUNK
    assert THREADS % chunks_per_group == 0, "the chunks THREADS apart are whole groups apart"
    groups_a_stride = THREADS // chunks_per_group  # groups between chunk c and chunk c + THREADS
    step_chunks, step_words = outputs_a_warp * chunks_a_step, outputs_a_warp * chunks_a_step * words
    pairs_a_chunk = CHUNK // 2  # x is read as uint64: two columns a load, the first in the low half
    write_sums = tree_writer(1, outputs_a_warp, gated)

    @cuda.jit(device=True)
    def step(x_pairs, packed, scales, biases, code_rows, group_rows, held, scale, bias, xs, acc, c, chunks, careful):
        """Chunks c, c + THREADS, ..., c + (chunks_a_step - 1) * THREADS of each output: loaded, then multiplied. With
        `careful`, a chunk past the last is loaded as the last one and not multiplied."""
        first_group = np.uint64(c) // np.uint64(chunks_per_group)  # unsigned, so a shift
        for j in range(outputs_a_warp):  # the step's chunks as stored
            for i in range(chunks_a_step):
                n = j * chunks_a_step + i
                if careful:
                    chunk = np.uint64(min(c + i * THREADS, chunks - 1))
                    g = group_rows[j] + chunk // np.uint64(chunks_per_group)
                    at = code_rows[j] + chunk * np.uint64(words)
                else:  # constant offsets from the step's first chunk
                    g = group_rows[j] + first_group + np.uint64(i * groups_a_stride)
                    at = code_rows[j] + np.uint64(c * words) + np.uint64(i * THREADS * words)
                scale[n], bias[n] = scales[g], biases[g]
                for w in range(words):
                    held[n * words + w] = packed[at + np.uint64(w)]
        for i in range(chunks_a_step):
            if not careful or c + i * THREADS < chunks:
                pairs = np.uint64(c * pairs_a_chunk) + np.uint64(i * THREADS * pairs_a_chunk)
                for e in range(CHUNK):
                    if e % 2 == 0:  # columns e and e + 1, one load
                        pair = x_pairs[pairs + np.uint64(e // 2)]
                        xs[0] = f32_from_bits(np.uint32(pair & np.uint64(0xFFFFFFFF)))
                        xs[1] = f32_from_bits(np.uint32(pair >> np.uint64(32)))
                    value = xs[e % 2]
                    for j in range(outputs_a_warp):
                        n = j * chunks_a_step + i
                        code = (held[n * words + e // per_word] >> np.uint32(bits * (e % per_word))) & mask
                        acc[j] = fma_rn(fma_rn(scale[n], np.float32(code), bias[n]), value, acc[j])

    @kernel
    def gemv_row_kernel(x_pairs, columns, packed, width, scales, biases, groups, y, rows_total, out_features, end1,
                        end2, end3):
        warp, t = cuda.threadIdx.x // THREADS, cuda.threadIdx.x % THREADS
        base, count = warp_outputs(cuda.blockIdx.x * WARPS + warp, outputs_a_warp, out_features, gated)
        acc = cuda.local.array(outputs_a_warp, np.float32)
        held = cuda.local.array(step_words, np.uint32)  # chunk n = j * chunks_a_step + i: words held[n * words:]
        scale = cuda.local.array(step_chunks, np.float32)  # chunk n's group's scale and bias
        bias = cuda.local.array(step_chunks, np.float32)
        code_rows = cuda.local.array(outputs_a_warp, np.uint64)  # where each output's codes start in `packed`
        group_rows = cuda.local.array(outputs_a_warp, np.uint64)  # and its scales and biases (past the last: the last)
        xs = cuda.local.array(2, np.float32)  # a pair of columns of x
        for j in range(outputs_a_warp):
            acc[j] = 0
            output = np.uint64(slot_output(base, j, count, gated))
            code_rows[j], group_rows[j] = output * np.uint64(width), output * np.uint64(groups)
        if base < count:  # a warp past the last output only joins the tree
            chunks = columns // CHUNK
            interior = chunks - (chunks_a_step - 1) * THREADS  # a step from a chunk before this has every chunk
            c = t
            while c < interior:
                step(x_pairs, packed, scales, biases, code_rows, group_rows, held, scale, bias, xs, acc, c, chunks,
                     False)
                c += chunks_a_step * THREADS
            if c < chunks:  # the last step reaches past the last chunk (which it reloads, and skips)
                step(x_pairs, packed, scales, biases, code_rows, group_rows, held, scale, bias, xs, acc, c, chunks,
                     True)
        partial = cuda.shared.array((WARPS, outputs_a_warp, THREADS), np.float32)
        write_sums(acc, partial, warp, t, base, 0, 1, y, rows_total, count, end1, end2, end3)

    return gemv_row_kernel


class GemvKernels:
    """One weight format's GEMV kernels, compiled on first use: a tile kernel per tile of TILES, outputs a warp and
    format constants, and for the affine formats (`row_kernel`) a one-row kernel per format constants."""

    def __init__(self, weight_format, row_kernel=None, wide=False):
        self.weight_format = weight_format  # (bits, group_size) -> the format's WeightFormat
        self.row_kernel = row_kernel  # (bits, group_size, outputs a warp, chunks a step) -> its one-row kernel, or None
        self.wide = wide  # whether a call with warps to spare takes WIDE_OUTPUTS outputs a warp (measured: affine)
        self.shapes = {}  # (rows a block holds (0: the one-row kernel), outputs a warp, bits, group size, gated) ->

    def for_call(self, rows, out_features, bits, group_size, gated=False):
        """(rows a block holds, outputs a warp, the kernel) for a call of `rows` rows; 0 rows a block is the one-row
        kernel (x as it is), any other the tile kernel (x in pair walk order). `gated`: the kernel that writes
        SiLU(gate) * up (see `launch_gemv`)."""
        tile = min((tile for tile in TILES if tile >= rows), default=max(TILES))  # the least that holds them
        if tile == 1 and self.row_kernel is not None:
            tile, per_warp = 0, ROW_OUTPUTS if -(-out_features // ROW_OUTPUTS) >= ROW_WIDE_WARPS else NARROW_OUTPUTS
        else:
            tiles = -(-rows // tile)
            spare = self.wide and -(-out_features // WIDE_OUTPUTS) * tiles >= WIDE_WARPS
            per_warp = WIDE_OUTPUTS if spare else OUTPUTS
        key = (tile, per_warp, bits, group_size, gated)
        if key not in self.shapes:
            if tile == 0:
                step = ROW_STEP if per_warp == ROW_OUTPUTS else NARROW_STEP
                self.shapes[key] = self.row_kernel(bits, group_size, per_warp, step, gated)
            else:
                self.shapes[key] = gemv_kernel(self.weight_format(bits, group_size), tile, per_warp, gated)
        return tile, per_warp, self.shapes[key]


gemv_f32_kernel = GemvKernels(f32_format)
gemv_bf16_kernel = GemvKernels(bf16_format)
gemv_affine_kernel = GemvKernels(affine_format, affine_row_kernel, wide=True)


def launch_walk_x(x, tile, stream=0):
    """x [rows, K] on the device in pair walk order by tiles of `tile` rows (see `walk_x`), float32."""
    tiles, rounds = -(-x.shape[0] // tile), -(-x.shape[1] // ROUND)
    out = cuda.device_array((tiles, rounds, tile, ROUND), np.float32, stream=stream)
    walk_x_kernel[(blocks_for(rounds * ROUND), tiles * tile), BLOCK, stream](x, tile, out)
    return out


def launch_gemv(kernels, x, out_features, *weight_args, stream=0, parts=None, gated=False):
    """Run a format's GEMV (`kernels`: gemv_f32_kernel, gemv_bf16_kernel or gemv_affine_kernel) over the rows of the
    device array x; `weight_args` are the weight (float formats) or (packed, scales, biases, bits, group_size).
    Returns y [rows, out_features]; with `parts` (up to PARTS widths that add up to out_features), a list of one
    array [rows, width] per part, each a contiguous piece of one output (no copy, whatever the row count); `gated`
    (a weight of gate rows, then as many up rows), SiLU(gate) * up [rows, out_features / 2] (`swiglu`)."""
    if gated and x.shape[0] > GATED_ROWS:  # the GEMV in two parts, gate and up, then their product
        gate, up = launch_gemv(kernels, x, out_features, *weight_args, stream=stream, parts=[out_features // 2] * 2)
        return launch_elementwise(silu_mul_kernel, gate, up, stream=stream)
    if len(weight_args) == 1:  # a float format: its weight stands in for the scales and biases it ignores
        weight_args = (weight_args[0], weight_args[0], weight_args[0], 0, CHUNK)
    data, scales, biases, bits, group_size = weight_args
    assert group_size % CHUNK == 0, "the affine kernel needs a group size that is a multiple of CHUNK"
    widths = [out_features] if parts is None else list(parts)
    assert 1 <= len(widths) <= PARTS and sum(widths) == out_features, f"parts {widths} of {out_features} outputs"
    ends = [int(e) for e in np.cumsum(widths)[:-1]] + [out_features] * (PARTS - len(widths))
    assert not gated or (parts is None and out_features % 2 == 0), "a gated GEMV has a gate for every up"
    rows = x.shape[0]
    tile, per_warp, kernel_for_call = kernels.for_call(rows, out_features, bits, group_size, gated)
    y = cuda.device_array(rows * out_features // (2 if gated else 1), np.float32, stream=stream)
    weight = (flat(data), data.shape[1], flat(scales), flat(biases), scales.shape[1], y, rows, out_features, *ends)
    blocks = -(-out_features // (WARPS * per_warp))
    if tile:
        walked = launch_walk_x(x, x_layout_tile(tile, per_warp), stream)  # read as uint64: two columns a load
        kernel_for_call[(blocks, -(-rows // tile)), WARPS * THREADS, stream](flat(walked).view(np.uint64),
                                                                            walked.shape[1], x.shape[1], *weight)
    else:  # x as it is, read as uint64: two float32 columns a load, the first in the low half
        kernel_for_call[blocks, WARPS * THREADS, stream](flat(x).view(np.uint64), x.shape[1], *weight)
    if parts is None:
        return y.reshape(rows, y.size // rows)
    starts = [0] + ends[:len(widths) - 1]
    return [y[start * rows:(start + width) * rows].reshape(rows, width) for start, width in zip(starts, widths)]


# --- embedding rows: the lookup of token ids, dequantized like the GEMV's weights -----------------------------------
# Twins: `weight[ids]`, `bf16_to_f32(bits[ids])`, `affine_rows(..., ids)`. Kernel mapping: one thread per
# (row, column) of the output.

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


# --- the contract -------------------------------------------------------------------------------------------------

def _cases(mode, rng):
    """(rows, outputs, columns): tiny under the simulator (a last chunk cut short, walks of several steps, one row
    of 4-bit codes past its interior steps); on GPU the projections of Qwen3.5-0.8B and 2B at 1 and 16 rows, a
    prompt chunk of 128 rows, odd sizes, and the 2B's head last (the controls stop at the first case that catches
    them)."""
    if mode == "sim":
        shapes = [(1, 3, 200), (3, 2, 128), (17, 2, 130), (2, 5, 1280), (1, 9, 1280)]
    else:
        shapes = [(1, 6144, 1024), (16, 3584, 1024), (128, 1024, 3584), (1, 6144, 2048), (16, 6144, 2048),
                  (1, 2048, 6144), (16, 2048, 6144), (3, 1000, 1088), (17, 248, 2048), (2, 333, 1030),
                  (1, 248320, 2048)]
    return [(f"{rows}x{outs}x{cols}", {"x": rng.normal(size=(rows, cols)).astype(np.float32),
                                         "weight": rng.normal(size=(outs, cols)).astype(np.float32)})
            for rows, outs, cols in shapes]


def _quantized_cases(bits):
    def cases(mode, rng):
        from tensorfold.numerics.formats import quantize_affine
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


def _chunks_swapped(weight):
    """Planted: chunks 0 and 1 swapped, in x and in the weight `weight` alike, as a walk that took the chunks in
    another order would read them: the exact sum stays, only the order of the additions moves."""
    def plant(inputs):
        x = inputs["x"]
        if x.shape[1] < 2 * CHUNK:
            return None
        stored = inputs[weight].shape[1] * CHUNK // x.shape[1]  # a chunk's entries: columns, or words of codes
        swap = lambda a, n: a[:, np.r_[n:2 * n, 0:n, 2 * n:a.shape[1]]]  # noqa: E731
        return {**inputs, "x": swap(x, CHUNK), weight: swap(inputs[weight], stored)}
    return plant


def _walk_cases(mode, rng):
    """x of a round's rows in tiles: a last round cut short, a chunk cut short, one short round, a last tile of
    fewer rows; on GPU 2B's widths in each tile of TILES."""
    shapes = ([(1, 200, 1), (3, 1280, 4), (2, 5, 8), (17, 130, 8)] if mode == "sim" else
              [(1, 2048, 1), (4, 2048, 4), (16, 6144, 8), (17, 1030, 8), (128, 1024, 8)])
    return [(f"{rows}x{columns} in tiles of {tile}", {"x": rng.normal(size=(rows, columns)).astype(np.float32),
                                                      "tile": tile})
            for rows, columns, tile in shapes]


def _launch_walk(x, tile):
    return to_host(launch_walk_x(cuda.to_device(x), tile))


def _columns_shifted(inputs):
    """Planted: every column read one place to its left, as a walk off by one column would."""
    return {**inputs, "x": np.roll(inputs["x"], 1, axis=1)} if inputs["x"].shape[1] > 1 else None


_ROW_CONTROLS = {"two swapped rows": swap_rows("x"), "a dropped row": drop_row("x")}
_AFFINE_CONTROLS = {**_ROW_CONTROLS, "a wrong group index": _wrong_group,
                    "chunks 0 and 1 swapped": _chunks_swapped("packed")}
CONTRACT = [
    KernelCheck("walk_x", walk_x, _launch_walk, _walk_cases,
                {**_ROW_CONTROLS, "columns shifted by one": _columns_shifted}),
    KernelCheck("gemv_f32", gemv_f32, _launch_f32, _cases,
                {**_ROW_CONTROLS, "chunks 0 and 1 swapped": _chunks_swapped("weight")}),
    KernelCheck("gemv_bf16", gemv_bf16, _launch_bf16, _bf16_cases,
                {**_ROW_CONTROLS, "chunks 0 and 1 swapped": _chunks_swapped("weight_bits")}),
    KernelCheck("gemv_affine4", gemv_affine, _launch_affine, _quantized_cases(4), _AFFINE_CONTROLS),
    KernelCheck("gemv_affine8", gemv_affine, _launch_affine, _quantized_cases(8), _AFFINE_CONTROLS),
]


def _parts_cases(mode, rng):
    """Outputs cut into parts (the stacked projections): every row count's kernel, parts of odd widths."""
    from tensorfold.numerics.formats import quantize_affine
    shapes = ([(3, (5, 3, 1, 7), 128), (1, (4, 12), 1280), (9, (8, 8), 128)] if mode == "sim" else
              [(1, (6144, 2048, 16, 16), 2048), (16, (6144, 2048, 16, 16), 2048), (4, (6144, 6144), 2048),
               (128, (4096, 512, 512), 1024)])
    cases = []
    for rows, widths, cols in shapes:
        packed, scales, biases = quantize_affine(rng.normal(size=(sum(widths), cols)).astype(np.float32), 4, 64)
        cases.append((f"{rows}x{'+'.join(map(str, widths))}x{cols}", {
            "x": rng.normal(size=(rows, cols)).astype(np.float32), "packed": packed, "scales": bf16_to_f32(scales),
            "biases": bf16_to_f32(biases), "widths": widths}))
    return cases


def _parts_twin(x, packed, scales, biases, widths):
    y = gemv_affine(x, packed, scales, biases, 4, 64)
    return tuple(np.split(y, np.cumsum(widths)[:-1], axis=1))


def _parts_launch(x, packed, scales, biases, widths):
    return tuple(to_host(p) for p in launch_gemv(
        gemv_affine_kernel, cuda.to_device(x), packed.shape[0], cuda.to_device(packed), cuda.to_device(scales),
        cuda.to_device(biases), 4, 64, parts=widths))


def _boundary_moved(inputs):
    """Planted: the first part cut one output late."""
    widths = inputs["widths"]
    return {**inputs, "widths": (widths[0] + 1, widths[1] - 1) + tuple(widths[2:])}


CONTRACT.append(KernelCheck("gemv_affine4 in parts", _parts_twin, _parts_launch, _parts_cases,
                            {**_ROW_CONTROLS, "a part boundary one output late": _boundary_moved}))


def _gated_cases(mode, rng):
    """The 4-bit cases cut to an even count of outputs (a gate for every up): one row, tiles, the head; in the
    simulator also one of more than GATED_ROWS rows (the GEMV, then the product)."""
    from tensorfold.numerics.formats import quantize_affine
    cases = []
    for label, inputs in _quantized_cases(4)(mode, rng):
        outs = len(inputs["packed"]) // 2 * 2
        if outs:
            cases.append((label, {**inputs, **{name: inputs[name][:outs] for name in ("packed", "scales", "biases")}}))
    if mode == "sim":
        packed, scales, biases = quantize_affine(rng.normal(size=(4, 128)).astype(np.float32), 4, 64)
        cases.append(("6x4x128", {"x": rng.normal(size=(6, 128)).astype(np.float32), "packed": packed,
                                  "scales": bf16_to_f32(scales), "biases": bf16_to_f32(biases), "bits": 4,
                                  "group_size": 64}))
    return cases


def _launch_gated(x, packed, scales, biases, bits, group_size):
    return to_host(launch_gemv(gemv_affine_kernel, cuda.to_device(x), packed.shape[0], cuda.to_device(packed),
                               cuda.to_device(scales), cuda.to_device(biases), bits, group_size, gated=True))


def _halves(plant):
    """A control that moves the up rows against the gate rows in the weight's three arrays alike."""
    def planted(inputs):
        half = len(inputs["packed"]) // 2
        return {**inputs, **{name: plant(inputs[name], half) for name in ("packed", "scales", "biases")}}
    return planted


_GATED_CONTROLS = {**_ROW_CONTROLS,
                   "gate and up swapped": _halves(lambda a, half: np.concatenate([a[half:], a[:half]])),
                   "each up one row late": _halves(lambda a, half: np.concatenate([a[:half], np.roll(a[half:], 1, 0)]))}
CONTRACT.append(KernelCheck("gemv_affine4 gated (SwiGLU)", lambda **i: swiglu(gemv_affine(**i)), _launch_gated,
                            _gated_cases, _GATED_CONTROLS))


def _embed_cases(mode, rng):
    from tensorfold.numerics.formats import quantize_affine
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
