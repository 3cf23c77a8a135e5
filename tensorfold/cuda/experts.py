"""The MoE block's routed experts: a grouped exact integer GEMM on the tensor cores.

    routed_experts(x, ids, gate_up, down)   y[r, n] = down_e(SiLU(gate_e(x[r])) * up_e(x[r])),  e = ids[r, n]

With the shared expert folded in (`shared`: it is the stacks' last expert, E), every row has one pair more, rank k,
on expert E: the shared expert runs in the same two grouped GEMMs as the routed ones, not in launches of its own.

The round's (row, rank) pairs, flat index p = row * per_row + rank (per_row = k, or k + 1 with the shared expert),
are grouped by expert: a counting sort puts them in expert order, and in increasing p within an expert
(`expert_pairs`). Each expert's rows are then multiplied by that expert's weights in the exact integer GEMM of
gemm.py (its arithmetic, its tile machinery): the sums are exact integers combined in float64 group by group and
chunk by chunk of K in an order fixed by K alone, so a row's output depends only on that row and its expert, never on
which rows share the expert or how many.

The twin sorts the pairs with NumPy and runs each expert's rows through `gemm.gemm_affine` (or any row-independent
`linear`). The kernels keep the expert ids on the device (no copy to the host, so a decode round with experts can
be recorded as a CUDA graph): `group_kernel` sorts the pairs on the device, `tile_kernel` lists the row tiles they
fill (each tile's expert and its pairs), and the GEMM's grid is sized for the worst case, its blocks reading their
expert and rows from that table (a block past the round's last tile returns).

Mappings: `group_kernel` a block an expert, its threads taking the pairs a block at a time (each pair's place: the
pairs of lower experts, and its own expert's earlier pairs, by a prefix sum over the block); `tile_kernel` one block,
a thread a run of experts (where its tiles start: a prefix sum over the block); `group_in_block` both in one block
for a round whose pairs are no more than its threads, a thread a pair (moe.py's `route_group_kernel` calls it after
routing the rows); `grouped_kernel` a block per (WARPS * tiles * 8 outputs, tile of 8 * row_halves of an expert's
sorted pairs, chunk of K), the block reading its tile's expert and pairs from the table (`tile_pairs`), then each
warp `gemm.tile_products` on the rows it gathers (gate/up: the pairs' rows of x; down: the pairs' rows of h) and its
expert's weight rows; then gemm.py's `combine_kernel`, SiLU(gate) * up for gate/up, one thread a (pair, output).
Where a round's pairs come a few an expert, `grouped_round_kernel` instead: a block per (tiles of outputs, row
tile), a warp a chunk of K, the block finishing the outputs from shared memory (gemm.py's `round_tile`), no combine.
Where K is one chunk, or a prompt's pairs fill the GPU, `grouped_whole_kernel`: a block per (WARPS tiles of outputs,
row tile), each warp walking all of K and finishing its outputs (gemm.py's `whole_tile`), no combine.
"""
import functools
from typing import NamedTuple

import numpy as np
from numba import cuda

from tensorfold.cuda.gemm import (CHUNK_COLUMNS, ROUND_CHUNKS, ROUND_ROWS, ROUND_TILES, WARPS, gemm_affine, round_tile,
                                  tile_products, warp_tiles, whole_bases, whole_tile)
from tensorfold.cuda.gemm_launch import kernel_shape, launch_combine, output_blocks, row_halves_for, whole_fills
from tensorfold.cuda.gemv import swiglu
from tensorfold.cuda.quantize import launch_quantize
from tensorfold.device.grid import flat
from tensorfold.device.launch import kernel

# --- the twins ----------------------------------------------------------------------------------------------------


def with_shared(ids, experts: int, shared: bool):
    """ids [rows, k], and with `shared` a last column naming the last of `experts` (the shared expert)."""
    ids = np.asarray(ids)
    return np.concatenate([ids, np.full((len(ids), 1), experts - 1, ids.dtype)], axis=1) if shared else ids


def expert_pairs(ids, experts: int) -> list:
    """For each expert, the (row, rank) pairs that chose it, as flat indices row * k + rank, in increasing order."""
    flat_ids = np.asarray(ids).reshape(-1)
    order = np.argsort(flat_ids, kind="stable")
    bounds = np.searchsorted(flat_ids[order], np.arange(experts + 1))
    return [order[bounds[e]:bounds[e + 1]] for e in range(experts)]


def affine_linear(x, weight):
    """`gemm_affine` for an affine Linear: the routed experts' `linear` when no backend supplies one."""
    return gemm_affine(x, weight.data, weight.scales, weight.biases, weight.bits, weight.group_size)


def routed_experts(x, ids, gate_up, down, linear=affine_linear, shared=False):
    """y float32 [rows, k, hidden] ([rows, k + 1, hidden] with `shared`: rank k is the last expert, the shared one,
    for every row): for every (row, rank) pair, its expert's SwiGLU of x [rows, hidden]. `gate_up` and `down` are
    each expert's Linears (gate rows then up rows [2 I, hidden]; [hidden, I]); each expert's pairs run through
    `linear` together, as one GEMM over its rows (rows sorted by expert)."""
    ids = with_shared(ids, len(gate_up), shared)
    rows, k = np.shape(ids)
    hidden = np.shape(x)[1]
    y = np.zeros((rows * k, hidden), np.float32)
    for e, pairs in enumerate(expert_pairs(ids, len(gate_up))):
        if len(pairs):
            y[pairs] = linear(swiglu(linear(x[pairs // k], gate_up[e])), down[e])
    return y.reshape(rows, k, hidden)


# --- the kernels --------------------------------------------------------------------------------------------------

BLOCK_THREADS = WARPS * 32  # threads of a grouped GEMM block
GROUP_THREADS = 128  # threads of a group_kernel block at most: the pairs it takes at a time
TILE_THREADS = 128  # threads of the tile_kernel's block: a run of experts each


@cuda.jit(device=True)
def pair_expert(ids, p, per_row, shared):
    """The expert of flat pair p: ids[row, rank], or `shared` for the rank past ids' columns (`with_shared`)."""
    rank = p % per_row
    return ids[p // per_row, rank] if rank < ids.shape[1] else shared


@cuda.jit(device=True)
def inclusive_scan(values, t, threads):
    """values[t] (shared, int32) becomes values[0] + ... + values[t], for t < threads: Hillis-Steele, log2(threads)
    steps. The sums are integers, so the order of the adds cannot change them. Every thread of the block calls it."""
    step = 1
    while step < threads:  # after this step, values[t] sums the values of t - 2 step + 1 .. t
        cuda.syncthreads()
        earlier = values[t - step] if t >= step else 0
        cuda.syncthreads()
        values[t] += earlier
        step *= 2
    cuda.syncthreads()


@kernel
def group_kernel(ids, per_row, shared, order, offsets):
    """`expert_pairs` on the device, as one sorted list: order [pairs] the flat pairs by expert, then by p; offsets
    [experts + 1] where each expert's pairs start (and the end). Block e takes expert e: its threads count the pairs
    of lower experts (where its pairs start), then take the pairs a block at a time, and each of its expert's pairs
    goes after the ones before it (a prefix sum of the block's matches). No atomics: each place is a count, so the
    order is fixed. The last block, e = experts, writes the end."""
    e, t, threads = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x
    counts = cuda.shared.array(GROUP_THREADS, np.int32)
    pairs = ids.shape[0] * per_row
    lower = 0
    for p in range(t, pairs, threads):
        if pair_expert(ids, p, per_row, shared) < e:
            lower += 1
    counts[t] = lower
    inclusive_scan(counts, t, threads)
    placed = counts[threads - 1]  # the pairs of lower experts
    if t == 0:
        offsets[e] = placed
    for first in range(0, pairs, threads):
        cuda.syncthreads()  # every thread has read counts before it is written again
        p = first + t
        mine = 1 if p < pairs and pair_expert(ids, p, per_row, shared) == e else 0
        counts[t] = mine
        inclusive_scan(counts, t, threads)
        if mine:
            order[placed + counts[t] - 1] = p
        placed += counts[threads - 1]


@cuda.jit(device=True)
def expert_tiles(offsets, e, tile_rows):
    """The row tiles of `tile_rows` that expert e's pairs fill."""
    return (offsets[e + 1] - offsets[e] + tile_rows - 1) // tile_rows


@kernel
def tile_kernel(order, offsets, tile_rows, table):
    """The row tiles of the sorted pairs, as the table the grouped kernels read: each expert's pairs in tiles of
    `tile_rows`, the experts' tiles in expert order; table[i, 0] the expert of tile i and table[i, 1 + j] its j-th
    pair (-1 past its expert's last), every entry -1 past the last tile. One block: thread t counts the tiles of its
    run of experts, the block adds the runs up (an integer prefix sum, in shared memory), and each thread writes its
    run's tiles."""
    t, threads = cuda.threadIdx.x, cuda.blockDim.x
    ends = cuda.shared.array(TILE_THREADS, np.int32)  # tiles before the end of each thread's run
    experts = offsets.shape[0] - 1
    run = (experts + threads - 1) // threads
    lowest, past = min(t * run, experts), min(t * run + run, experts)
    count = 0
    for e in range(lowest, past):
        count += expert_tiles(offsets, e, tile_rows)
    ends[t] = count
    inclusive_scan(ends, t, threads)
    tile = ends[t] - count
    for e in range(lowest, past):
        for n in range(expert_tiles(offsets, e, tile_rows)):
            write_tile(table, tile, e, order, offsets[e] + n * tile_rows, offsets[e + 1])
            tile += 1
    clear_tiles(table, ends[threads - 1] + t, threads)


@cuda.jit(device=True)
def write_tile(table, tile, e, order, first, end):
    """Row `tile` of the table: expert e, then the pairs at places first .. first + tile_rows - 1 of the order (-1
    from `end` on, past the expert's last)."""
    table[tile, 0] = e
    for j in range(table.shape[1] - 1):
        table[tile, 1 + j] = order[first + j] if first + j < end else -1


@cuda.jit(device=True)
def clear_tiles(table, lowest, threads):
    """The table's rows from `lowest` on, every `threads`-th (the caller's share), all -1: no tile."""
    for i in range(lowest, table.shape[0], threads):
        for j in range(table.shape[1]):
            table[i, j] = -1


@cuda.jit(device=True)
def group_in_block(ids, per_row, shared, order, offsets, tile_rows, table, experts_of, sorted_experts, starts):
    """`group_kernel` and `tile_kernel` in one block, for a round whose pairs are no more than the block's threads:
    thread t takes pair t, counts the pairs before it in the order (lower experts; its expert's pairs before it) and
    writes itself at that place; a place starts a row tile where it is its expert's first or `tile_rows` on from one,
    and the tile's number is the count of starts up to it (an integer prefix sum), its thread writing the tile's row
    of the table (`write_tile`, as `tile_kernel` does); expert e's pairs start at the first place whose expert is e or
    higher (a binary search of the sorted experts). experts_of, sorted_experts and starts are the block's shared
    int32 arrays, a slot a thread. The counts are integers, so the order is fixed."""
    t, threads = cuda.threadIdx.x, cuda.blockDim.x
    pairs, experts = ids.shape[0] * per_row, offsets.shape[0] - 1
    starts[t] = 0
    if t < pairs:
        experts_of[t] = pair_expert(ids, t, per_row, shared)
    cuda.syncthreads()  # every pair's expert is in experts_of, every start cleared
    place, first = 0, False
    if t < pairs:
        e, place = experts_of[t], 0
        before = 0  # its expert's pairs before it
        for q in range(pairs):
            if experts_of[q] < e:
                place += 1
            elif experts_of[q] == e and q < t:
                before += 1
        place += before
        first = before % tile_rows == 0
        order[place], sorted_experts[place] = t, e
        starts[place] = 1 if first else 0
    inclusive_scan(starts, t, threads)  # starts[place]: the tiles that start at or before place (and a barrier)
    if first:  # the order is written: the barrier made the block's global writes visible to it
        end = place + 1  # one past the tile's last place of expert e
        while end < min(pairs, place + tile_rows) and sorted_experts[end] == e:
            end += 1
        write_tile(table, starts[place] - 1, e, order, place, end)
    clear_tiles(table, starts[threads - 1] + t, threads)
    for e in range(t, experts + 1, threads):  # where expert e's pairs start: the first place of e or a higher expert
        low, high = 0, pairs
        while low < high:
            middle = (low + high) // 2
            if sorted_experts[middle] < e:
                low = middle + 1
            else:
                high = middle
        offsets[e] = low


@cuda.jit(device=True)
def tile_pairs(table, per_row, x_rows, out_rows, row_halves):
    """The expert of the block's row tile (block y: row y of `tile_kernel`'s table), -1 past the round's last tile
    (the grid is sized for the worst case), and the lane's rows of the tile: row g + 8 rho is the tile's pair g + 8
    rho, which reads x row pair // per_row (k for gate/up, whose x is a row per token; 1 for down, a row per pair) and
    writes row pair; past the expert's last pair (-1) it reads x row 0 (any row: its products are not written) and
    writes nothing. Every load here waits on none but the block's index: the pairs are in the table itself."""
    y = cuda.blockIdx.y
    expert = table[y, 0]
    if expert >= 0:
        for rho in range(row_halves):
            pair = table[y, 1 + cuda.threadIdx.x % 32 // 4 + 8 * rho]
            x_rows[rho] = max(pair, 0) // per_row
            out_rows[rho] = pair
    return expert


@functools.cache
def grouped_kernel(bits, group_size, words, row_halves, tiles):
    """The grouped GEMM kernel: block (x, y, z) takes outputs from (x * WARPS + warp) * tiles * 8 on, row tile y of
    the sorted pairs (`tile_pairs`), chunk z of K, and writes its partial sums."""
    products = tile_products(bits, group_size, words, row_halves, tiles, ahead=row_halves == 1)

    @kernel
    def grouped(digits, exponents, sums, columns, rows_pad, packed, width, scales, biases, groups, partials, pairs,
                out_features, table, per_row):
        x_rows = cuda.local.array(row_halves, np.int64)
        out_rows = cuda.local.array(row_halves, np.int64)
        expert = tile_pairs(table, per_row, x_rows, out_rows, row_halves)
        if expert < 0:
            return
        bases = cuda.local.array(tiles, np.int64)
        warp_tiles(bases, tiles)
        products(digits, exponents, sums, columns, rows_pad, packed, width, scales, biases, groups, partials,
                 pairs * out_features, out_features, out_features, expert * out_features, cuda.blockIdx.z, bases,
                 bases, x_rows, out_rows, False)

    return grouped


@functools.cache
def grouped_round_kernel(bits, group_size, words, row_halves, tiles, chunks, gated):
    """The grouped GEMM and its combine in one launch, for a round's few pairs an expert (gemm.py's `round_tile`):
    block (x, y) of `chunks` warps takes row tile y of the sorted pairs and the outputs of its tiles from x on; y
    [pairs, outputs], gated SiLU(gate) * up."""
    tile = round_tile(bits, group_size, words, row_halves, tiles, chunks, gated)

    @kernel
    def grouped_round(digits, exponents, sums, columns, rows_pad, packed, width, scales, biases, groups, y, pairs,
                      out_features, table, per_row):
        x_rows = cuda.local.array(row_halves, np.int64)
        out_rows = cuda.local.array(row_halves, np.int64)
        expert = tile_pairs(table, per_row, x_rows, out_rows, row_halves)
        if expert < 0:
            return
        tile(digits, exponents, sums, columns, rows_pad, packed, width, scales, biases, groups, out_features,
             expert * out_features, x_rows, out_rows, y, pairs, out_features, out_features, out_features)

    return grouped_round


@functools.cache
def grouped_whole_kernel(bits, group_size, words, row_halves, tiles, gated):
    """The grouped GEMM over the whole of K and its finish in one launch (gemm.py's `whole_tile`): block (x, y) takes
    row tile y of the sorted pairs, and its warp w the outputs from (x * WARPS + w) * written on (`whole_bases`);
    y [pairs, outputs], gated SiLU(gate) * up."""
    whole = whole_tile(bits, group_size, words, row_halves, tiles, gated)
    written = 4 * tiles if gated else 8 * tiles

    @kernel
    def grouped_whole(digits, exponents, sums, columns, rows_pad, packed, width, scales, biases, groups, y, pairs,
                      out_features, table, per_row):
        x_rows = cuda.local.array(row_halves, np.int64)
        out_rows = cuda.local.array(row_halves, np.int64)
        expert = tile_pairs(table, per_row, x_rows, out_rows, row_halves)
        if expert < 0:
            return
        bases = cuda.local.array(tiles, np.int64)
        whole_bases(bases, tiles, written, gated, out_features // 2 if gated else out_features)
        whole(digits, exponents, sums, columns, rows_pad, packed, width, scales, biases, groups, out_features,
              expert * out_features, bases, x_rows, out_rows, y, pairs, out_features, out_features, out_features)

    return grouped_whole


# --- launchers ----------------------------------------------------------------------------------------------------

class Grouping(NamedTuple):
    """A round's pairs grouped by expert on the device (`group_launch`): the pairs in expert order, where each
    expert's start, the table of row tiles (`tile_kernel`: each tile's expert and pairs) and the rows of a tile."""
    order: object
    offsets: object
    table: object
    tile_rows: int


def new_grouping(pairs, experts, stream=0) -> Grouping:
    """Unwritten device arrays for the grouping of `pairs` pairs on `experts` experts, its tiles of the rows the
    grouped kernels' shape takes (`grouped_shape`)."""
    tile_rows = 8 * row_halves_for(-(-pairs // experts))
    return Grouping(cuda.device_array(pairs, np.int32, stream=stream),
                    cuda.device_array(experts + 1, np.int32, stream=stream),
                    cuda.device_array((row_tiles(pairs, experts, tile_rows), 1 + tile_rows), np.int32, stream=stream),
                    tile_rows)


def group_launch(ids, experts, shared=False, stream=0) -> Grouping:
    """`group_kernel` and `tile_kernel` on device ids [rows, k] (with `shared`, a last rank on the last expert for
    every row): order [pairs], offsets [experts + 1] and the table [row tiles, 1 + tile rows], on the device
    (`new_grouping`)."""
    per_row = ids.shape[1] + shared
    pairs = ids.shape[0] * per_row
    grouping = new_grouping(pairs, experts, stream)
    threads = min(GROUP_THREADS, max(32, 1 << (pairs - 1).bit_length()))  # a decode round's few pairs: one warp
    group_kernel[experts + 1, threads, stream](ids, per_row, experts - 1, grouping.order, grouping.offsets)
    tile_kernel[1, TILE_THREADS, stream](grouping.order, grouping.offsets, grouping.tile_rows, grouping.table)
    return grouping


def row_tiles(pairs, experts, tile_rows) -> int:
    """The most row tiles `pairs` pairs on `experts` experts fill (the sum of ceil(n_e / tile_rows), at most): the
    tile table's length, and the grouped kernels' grid."""
    return min(pairs, pairs // tile_rows + min(experts, pairs))


def grouped_shape(pairs, experts, weight, columns):
    """(words, row halves, tiles) of the grouped kernel: the shape a GEMM of the rows an expert gets on average
    takes (a choice of speed only: every shape gives the same bits)."""
    return kernel_shape(-(-pairs // experts), weight.bits, weight.group_size, columns)


def grouped_gemm(x, per_row, grouping, pairs, weight, experts, stream=0, gated=False, whole=None):
    """Each pair's row of x (row pair // per_row) times its expert's rows of the stacked affine `weight`
    ([experts * out, K]): [pairs, out], or SiLU(gate) * up [pairs, out / 2] where `gated`."""
    words = grouped_shape(pairs, experts, weight, x.shape[1])[0]
    quantized = launch_quantize(x, weight.bits, weight.group_size, words, x.shape[0], stream)
    return grouped_products(quantized, per_row, grouping, pairs, weight, experts, stream, gated, whole)


def grouped_products(quantized, per_row, grouping, pairs, weight, experts, stream=0, gated=False, whole=None):
    """The second half of `grouped_gemm`: on x's digits, exponents and S (`launch_quantize`, laid out for
    `grouped_shape`), the round kernel for a round's few pairs an expert and few chunks of K (as `launch_products`
    takes it); else the whole kernel where gemm_launch.py's `whole_fills` says so; else the grouped kernel a chunk of
    K a block and the combine. `whole` True takes the whole kernel, False any other."""
    digits, exponents, sums = quantized
    columns, x_rows = digits.shape[2], digits.shape[1]
    out_features = weight.out_features // experts
    count = out_features // 2 if gated else out_features
    words, halves, tiles = grouped_shape(pairs, experts, weight, columns)
    tile_rows, row_tile_slots = 8 * halves, grouping.table.shape[0]  # the grid's rows: the table's slots
    assert tile_rows == grouping.tile_rows, "the grouping's tiles are the kernel's"
    chunks = -(-columns // CHUNK_COLUMNS)
    arguments = (flat(digits).view(np.uint32), flat(exponents), flat(sums), columns, x_rows, flat(weight.data),
                 weight.data.shape[1], flat(weight.scales), flat(weight.biases), weight.scales.shape[1])
    written = 4 * tiles if gated else 8 * tiles
    blocks = -(-count // (WARPS * written))
    average = -(-pairs // experts)  # an expert's pairs on average
    round_fits = average <= ROUND_ROWS and chunks <= ROUND_CHUNKS and tiles == ROUND_TILES
    if whole or (whole is None and not round_fits and whole_fills(average, blocks * pairs // tile_rows, chunks)):
        finishing = grouped_whole_kernel(weight.bits, weight.group_size, words, halves, tiles, gated)[
            (blocks, row_tile_slots), BLOCK_THREADS, stream]
    elif round_fits:
        finishing = grouped_round_kernel(weight.bits, weight.group_size, words, halves, tiles, chunks, gated)[
            (-(-count // written), row_tile_slots), chunks * 32, stream]
    else:
        finishing = None
    if finishing is not None:  # both kernels finish their outputs themselves, and take the same arguments
        y = cuda.device_array(pairs * count, np.float32, stream=stream)
        finishing(*arguments, y, pairs, out_features, grouping.table, per_row)
        return y.reshape(pairs, count)
    partials = cuda.device_array(chunks * pairs * out_features, np.float64, stream=stream)
    grouped_kernel(weight.bits, weight.group_size, words, halves, tiles)[
        (output_blocks(out_features, tiles), row_tile_slots, chunks), BLOCK_THREADS, stream](
        *arguments, partials, pairs, out_features, grouping.table, per_row)
    return launch_combine(partials, chunks, pairs, out_features, stream, gated=gated)


def routed_experts_launch(x, ids, gate_up, down, shared=False, stream=0, whole=None, grouping=None):
    """`routed_experts` on the device for affine expert stacks (one Linear each: gate_up [E * 2 I, hidden], down
    [E * hidden, I]): y [rows, k, hidden], or [rows, k + 1, hidden] with `shared`. `grouping`: the pairs already
    grouped (moe.py's `route_group_launch`), else grouped here. `whole`: the kernels' choice (`grouped_products`), for
    the checks that run each."""
    rows, k = ids.shape[0], ids.shape[1] + shared
    hidden, pairs = x.shape[1], rows * k
    experts = down.out_features // hidden
    if grouping is None:
        grouping = group_launch(ids, experts, shared, stream)
    h = grouped_gemm(x, k, grouping, pairs, gate_up, experts, stream, gated=True, whole=whole)
    return grouped_gemm(h, 1, grouping, pairs, down, experts, stream, whole=whole).reshape(rows, k, hidden)
