"""The sparse MoE block's own steps around the routed experts (experts.py): the router and the weighted sum.

    route(logits, k)        p = softmax(logits) in float32; the k largest p, best first (ties: the lower expert);
                            weights w = p_chosen / sum(p_chosen)
    combine(y, w, s, g)     out[r] = sum over n in rank order of w[r, n] * y[r, n], then + sigmoid(g[r]) * s[r]

The router's sums run over the experts in increasing order, and every choice compares (p, expert) in one total
order, so a row's choice is fixed by its logits alone. The softmax's exp is `exp32` (float64, rounded once). The
ids stay on the device for the routed experts' grouped GEMM (experts.py), y [rows, k, hidden] its output.

The weighted sum is `fma32` (float64, rounded once) rank by rank, the highest weight first, then the shared
expert's output times its gate.

Mappings: `route_kernel` one warp a row, lane t holding experts t, t + 32, ... in registers: each expert's
probability computed once, the sum by one lane in expert order from a copy in shared memory, and each rank's choice
a butterfly of shuffles in the total order (a warp, not a block: a decode round routes one row a layer, and a
block's reductions wait at a barrier each step); `route_group_kernel`, for a round's few rows, one block: a warp a
row routes it, then the block groups the round's pairs by expert for the routed experts (experts.py's
`group_in_block`), one launch where the router, the sort and the tile table take three; `combine_kernel` one thread a
(row, hidden output).
"""
import functools

import numpy as np
from numba import cuda

from tensorfold.cuda.experts import group_in_block, group_launch, new_grouping
from tensorfold.cuda.fmath import exp32, exp32_twin, fma32, sigmoid32, sigmoid32_twin
from tensorfold.cuda.ptx import FULL_WARP, shfl_xor
from tensorfold.device.grid import BLOCK, blocks_for
from tensorfold.device.launch import kernel

MAX_EXPERTS = 4096  # experts a router block holds (16 KiB of shared memory at most): the configs' limit is no larger
SUM_BATCH = 8  # probabilities the router's sum loads at a time
GROUPED_ROWS = 16  # rows up to which the router and the grouping take one block (a warp a row, a thread a pair)
GROUPED_SHARED = 32 * 1024  # bytes of the warps' probabilities that block may hold in shared memory

# --- the twins ----------------------------------------------------------------------------------------------------


def route(logits, k):
    """(ids int32 [rows, k], weights float32 [rows, k]) of router logits [rows, experts]: the k most probable
    experts, best first, the lower expert first among equal probabilities, and their renormalised weights."""
    logits = np.asarray(logits, np.float32)
    rows, experts = logits.shape
    e = exp32_twin(logits - logits.max(axis=1, keepdims=True))
    total = np.zeros(rows, np.float32)
    for j in range(experts):  # in expert order, as the kernel adds them
        total = total + e[:, j]
    p = e / total[:, None]
    ids = np.argsort(-p, axis=1, kind="stable")[:, :k].astype(np.int32)  # stable: ties keep the lower expert first
    chosen = np.take_along_axis(p, ids, axis=1)
    chosen_total = np.zeros(rows, np.float32)
    for n in range(k):
        chosen_total = chosen_total + chosen[:, n]
    return ids, chosen / chosen_total[:, None]


def combine(routed, weights, shared, gate_logit):
    """out [rows, hidden]: the routed outputs [rows, k, hidden] weighted rank by rank, then the shared expert's
    output [rows, hidden] times sigmoid(gate_logit [rows, 1]); each step one float32 rounding (`fma32`). With
    `shared` None the shared expert is folded in (experts.py): routed is [rows, k + 1, hidden], its rank k the
    shared expert's output."""
    k = np.shape(weights)[1]
    shared = routed[:, k] if shared is None else shared
    acc = np.zeros(np.shape(shared), np.float32)
    for n in range(k):
        acc = fma32.py_func(weights[:, n, None], routed[:, n], acc)
    return fma32.py_func(sigmoid32_twin(gate_logit), shared, acc)


# --- the kernels --------------------------------------------------------------------------------------------------

@cuda.jit(device=True)
def ranks_before(p, j, q, i):
    """Whether expert j with probability p ranks before expert i with q: p higher, or equal and j lower."""
    return p > q or (p == q and j < i)


@cuda.jit(device=True)
def warp_best(value, expert):
    """The warp's first (value, expert) pair in the order of `ranks_before`, in every lane: a butterfly of shuffles.
    The order is total, so the pairing cannot change the winner."""
    step = 1
    while step < 32:
        other, other_expert = shfl_xor(value, step, FULL_WARP), shfl_xor(expert, step, FULL_WARP)
        if ranks_before(other, other_expert, value, expert):
            value, expert = other, other_expert
        step *= 2
    return value, expert


@functools.cache
def route_row(slots):
    """Row r's route by the calling warp, for rows of up to 32 * `slots` experts: lane t holds experts t + 32 i, i <
    slots, in registers (`slots` a constant, so the loops over them unroll); p [32 * slots] and total [1] are the
    warp's own shared memory. Every warp of the block must call it (it meets the block's barrier): `route_kernel` runs
    it in a block of one warp a row, `route_group_kernel` in a block of one warp for each row."""

    @cuda.jit(device=True)
    def route(logits, r, k, ids, weights, p, total):
        lane = cuda.threadIdx.x % 32
        experts = logits.shape[1]
        mine = cuda.local.array(slots, np.float32)  # the lane's logits, then probabilities, -1 once chosen
        largest = logits[r, 0]  # the row's largest logit: a maximum, the same in any order
        for i in range(slots):
            j = lane + 32 * i
            mine[i] = logits[r, j] if j < experts else np.float32(-3)  # -3: below every mark, never chosen
            if j < experts:
                largest = max(largest, mine[i])
        top = warp_best(largest, np.int32(0))[0]
        for i in range(slots):
            j = lane + 32 * i
            if j < experts:
                mine[i] = exp32(mine[i] - top)
                p[j] = mine[i]
        cuda.syncthreads()  # every lane's probabilities are in p (each warp of the block routes a row: all meet)
        if lane == 0:  # the softmax's sum in expert order, one lane, as the twin adds
            total[0] = sum_in_order(p, experts)
        cuda.syncthreads()  # the sum is in total
        for i in range(slots):
            if lane + 32 * i < experts:
                mine[i] = np.float32(mine[i] / total[0])
        chosen_total = np.float32(0)
        for n in range(k):  # rank n: the first expert not yet chosen, in the order of ranks_before
            best_p, best = np.float32(-2), np.int32(experts)  # below every probability and every chosen mark
            for i in range(slots):
                if ranks_before(mine[i], lane + 32 * i, best_p, best):
                    best_p, best = mine[i], np.int32(lane + 32 * i)
            best_p, best = warp_best(best_p, best)
            for i in range(slots):  # its lane marks it chosen (a constant index: mine stays in registers)
                if lane + 32 * i == best:
                    mine[i] = np.float32(-1)
            chosen_total += best_p  # every lane holds the choice, so every lane adds the same sum in rank order
            if lane == n % 32:  # rank n is lane n % 32's to write, and to renormalise below
                ids[r, n], weights[r, n] = best, best_p
        for n in range(lane, k, 32):  # a lane reads back its own writes: no wait on the others
            weights[r, n] = np.float32(weights[r, n] / chosen_total)

    return route


@functools.cache
def route_kernel(slots):
    """The router for rows of up to 32 * `slots` experts: a block of one warp a row (`route_row`)."""
    row = route_row(slots)
    held = 32 * slots  # a name: numba takes a shared array's size as one

    @kernel
    def route(logits, k, ids, weights):
        p = cuda.shared.array(held, np.float32)  # every probability, for lane 0's sum
        total = cuda.shared.array(1, np.float32)
        row(logits, cuda.blockIdx.x, k, ids, weights, p, total)

    return route


@functools.cache
def route_group_kernel(slots, rows):
    """The router of `rows` rows of up to 32 * `slots` experts and the grouping of their pairs in one block: warp r
    routes row r (`route_row`), then the block groups the pairs (experts.py's `group_in_block`)."""
    row = route_row(slots)
    held, threads = 32 * slots, 32 * rows  # names: numba takes a shared array's shape as constants

    @kernel
    def route_group(logits, k, ids, weights, per_row, shared, order, offsets, tile_rows, table):
        warp = cuda.threadIdx.x // 32
        p = cuda.shared.array((rows, held), np.float32)  # each warp's probabilities, for its lane 0's sum
        total = cuda.shared.array(rows, np.float32)
        row(logits, warp, k, ids, weights, p[warp], total[warp:warp + 1])
        cuda.syncthreads()  # every row's ids are written (a barrier makes the block's global writes visible to it)
        experts_of = cuda.shared.array(threads, np.int32)
        sorted_experts = cuda.shared.array(threads, np.int32)
        starts = cuda.shared.array(threads, np.int32)
        group_in_block(ids, per_row, shared, order, offsets, tile_rows, table, experts_of, sorted_experts, starts)

    return route_group


@cuda.jit(device=True)
def sum_in_order(values, count):
    """values[0] + values[1] + ... + values[count - 1] in float32, left to right, read SUM_BATCH at a time: the
    loads of a batch are in flight together, and its adds keep the order."""
    acc = np.float32(0)
    batch = cuda.local.array(SUM_BATCH, np.float32)
    full = count - count % SUM_BATCH
    for first in range(0, full, SUM_BATCH):
        for u in range(SUM_BATCH):
            batch[u] = values[first + u]
        for u in range(SUM_BATCH):
            acc += batch[u]
    for j in range(full, count):
        acc += values[j]
    return acc


@kernel
def combine_kernel(routed, weights, shared, shared_rank, gate_logit, out):
    """`combine`, the shared expert's output read at shared[r, shared_rank] (routed and rank k where it is folded
    in, else its own array seen as [rows, 1, hidden] and rank 0)."""
    i = cuda.grid(1)
    hidden = out.shape[1]
    r, o = i // hidden, i % hidden
    if r < out.shape[0]:
        acc = np.float32(0)
        for n in range(weights.shape[1]):
            acc = fma32(weights[r, n], routed[r, n, o], acc)
        out[r, o] = fma32(sigmoid32(gate_logit[r, 0]), shared[r, shared_rank, o], acc)


# --- launchers ----------------------------------------------------------------------------------------------------

def route_launch(logits, k, stream=0):
    """`route` on device logits: (ids, weights) device arrays [rows, k]."""
    rows = logits.shape[0]
    assert logits.shape[1] <= MAX_EXPERTS, f"{logits.shape[1]} experts: a router block holds {MAX_EXPERTS}"
    ids = cuda.device_array((rows, k), np.int32, stream=stream)
    weights = cuda.device_array((rows, k), np.float32, stream=stream)
    route_kernel(-(-logits.shape[1] // 32))[rows, 32, stream](logits, k, ids, weights)
    return ids, weights


def route_group_launch(logits, k, experts, shared=False, stream=0):
    """`route` and the grouping of its pairs on `experts` experts (with `shared`, every row's rank k on the last:
    experts.py's `group_launch`): (ids, weights, grouping) on the device. A round's few rows take one launch
    (`route_group_kernel`) where each row's warp and its probabilities fit a block; more rows take three."""
    rows, slots = logits.shape[0], -(-logits.shape[1] // 32)
    per_row = k + shared
    if rows > GROUPED_ROWS or per_row > 32 or rows * slots * 32 * 4 > GROUPED_SHARED:
        ids, weights = route_launch(logits, k, stream)
        return ids, weights, group_launch(ids, experts, shared, stream)
    ids = cuda.device_array((rows, k), np.int32, stream=stream)
    weights = cuda.device_array((rows, k), np.float32, stream=stream)
    grouping = new_grouping(rows * per_row, experts, stream)
    route_group_kernel(slots, rows)[1, 32 * rows, stream](logits, k, ids, weights, per_row, experts - 1,
                                                          grouping.order, grouping.offsets, grouping.tile_rows,
                                                          grouping.table)
    return ids, weights, grouping


def combine_launch(routed, weights, shared, gate_logit, stream=0):
    """`combine` on the device: out [rows, hidden]. A folded shared expert is read inside routed: a view of its rank
    would be strided, and numba builds a strided view's extents on the host row by row."""
    rows, hidden = routed.shape[0], routed.shape[2]
    shared, shared_rank = (routed, weights.shape[1]) if shared is None else (shared.reshape(rows, 1, hidden), 0)
    out = cuda.device_array((rows, hidden), np.float32, stream=stream)
    combine_kernel[blocks_for(rows * hidden), BLOCK, stream](routed, weights, shared, shared_rank, gate_logit, out)
    return out
