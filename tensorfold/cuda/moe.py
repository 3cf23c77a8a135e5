"""The sparse MoE block's own steps: the router, the routed experts as one grouped launch, and the weighted sum.

    route(logits, k)        p = softmax(logits) in float32; the k largest p, best first (ties: the lower expert);
                            weights w = p_chosen / sum(p_chosen)
    routed_experts(x, ...)  y[r, n] = down_e(SiLU(gate_e(x[r])) * up_e(x[r])),  e = ids[r, n]
    combine(y, w, s, g)     out[r] = sum over n in rank order of w[r, n] * y[r, n], then + sigmoid(g[r]) * s[r]

The router's sums run over the experts in increasing order, and every choice compares (p, expert) in one total
order, so a row's choice is fixed by its logits alone. The softmax's exp is `exp32` (float64, rounded once).

The routed experts are a grouped GEMM: the twin sorts the round's (row, rank) pairs by expert and runs each
expert's rows through the exact integer GEMM (`gemm.gemm_affine`, or any row-independent `linear`), the kernels
give every (pair, output) a thread that reads its expert from `ids` on the device (no copy to the host, so a
decode round with experts can be recorded as a CUDA graph). A row's output depends only on that row and its
expert: the sums are exact integers, in any order, combined in float64 group by group and chunk by chunk of K in
increasing order (the arithmetic of gemm.py's docstring), so which other rows share an expert, and how many, cannot change a bit.

The weighted sum is `fma32` (float64, rounded once) rank by rank, the highest weight first, then the shared
expert's output times its gate.

Mappings: `route_kernel` one thread a row; `fixed_point_kernel` one thread a (row, group); `expert_gate_up_kernel`
one thread a (pair, intermediate output), `expert_down_kernel` one a (pair, hidden output); `combine_kernel` one a
(row, hidden output).
"""
import math

import numpy as np
from numba import cuda

from tensorfold.cuda.fmath import exp32, exp32_twin, fma32, sigmoid32, sigmoid32_twin, silu32
from tensorfold.cuda.gemm import CHUNK_COLUMNS, P, fixed_point, gemm_affine
from tensorfold.cuda.gemv import swiglu
from tensorfold.device.grid import BLOCK, blocks_for
from tensorfold.device.launch import kernel

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


def expert_pairs(ids, experts: int) -> list:
    """For each expert, the (row, rank) pairs that chose it, as flat indices row * k + rank, in increasing order."""
    flat = np.asarray(ids).reshape(-1)
    order = np.argsort(flat, kind="stable")
    bounds = np.searchsorted(flat[order], np.arange(experts + 1))
    return [order[bounds[e]:bounds[e + 1]] for e in range(experts)]


def affine_linear(x, weight):
    """`gemm_affine` for an affine Linear: the routed experts' `linear` when no backend supplies one."""
    return gemm_affine(x, weight.data, weight.scales, weight.biases, weight.bits, weight.group_size)


def routed_experts(x, ids, gate_up, down, linear=affine_linear):
    """y float32 [rows, k, hidden]: for every (row, rank) pair, its expert's SwiGLU of x [rows, hidden]. `gate_up`
    and `down` are each expert's Linears (gate rows then up rows [2 I, hidden]; [hidden, I]); each expert's pairs
    run through `linear` together, as one GEMM over its rows (rows sorted by expert)."""
    rows, k = np.shape(ids)
    hidden = np.shape(x)[1]
    y = np.zeros((rows * k, hidden), np.float32)
    for e, pairs in enumerate(expert_pairs(ids, len(gate_up))):
        if len(pairs):
            y[pairs] = linear(swiglu(linear(x[pairs // k], gate_up[e])), down[e])
    return y.reshape(rows, k, hidden)


def combine(routed, weights, shared, gate_logit):
    """out [rows, hidden]: the routed outputs [rows, k, hidden] weighted rank by rank, then the shared expert's
    output [rows, hidden] times sigmoid(gate_logit [rows, 1]); each step one float32 rounding (`fma32`)."""
    acc = np.zeros(np.shape(shared), np.float32)
    for n in range(np.shape(weights)[1]):
        acc = fma32.py_func(weights[:, n, None], routed[:, n], acc)
    return fma32.py_func(sigmoid32_twin(gate_logit), shared, acc)


# --- the kernels --------------------------------------------------------------------------------------------------

@kernel
def route_kernel(logits, k, ids, weights):
    r = cuda.grid(1)
    if r < logits.shape[0]:
        experts = logits.shape[1]
        top = logits[r, 0]
        for j in range(1, experts):
            top = max(top, logits[r, j])
        total = np.float32(0)
        for j in range(experts):
            total += exp32(logits[r, j] - top)
        previous, previous_p, chosen_total = -1, np.float32(0), np.float32(0)
        for n in range(k):  # rank n: the best (p, expert) after rank n - 1's in the order (p down, expert up)
            best, best_p = -1, np.float32(0)
            for j in range(experts):
                p = np.float32(exp32(logits[r, j] - top) / total)
                later = previous < 0 or p < previous_p or (p == previous_p and j > previous)
                if later and (best < 0 or p > best_p):
                    best, best_p = j, p
            ids[r, n], weights[r, n] = best, best_p
            chosen_total += best_p
            previous, previous_p = best, best_p
        for n in range(k):
            weights[r, n] = np.float32(weights[r, n] / chosen_total)


@kernel
def fixed_point_kernel(x, group_size, X, exponents, sums):
    """x's fixed point per row and group, as gemm.quantize_x computes it: X int32, e and S int32 [rows, groups]."""
    i = cuda.grid(1)
    groups = exponents.shape[1]
    row, group = i // groups, i % groups
    if row < x.shape[0]:
        largest = np.float32(0)
        for c in range(group * group_size, (group + 1) * group_size):
            largest = max(largest, abs(x[row, c]))
        e = math.frexp(np.float64(largest))[1]
        scale = math.ldexp(1.0, P - e)
        total = 0
        for c in range(group * group_size, (group + 1) * group_size):
            value = fixed_point(x[row, c], scale)[0]
            X[row, c] = value
            total += value
        exponents[row, group], sums[row, group] = e, total


@cuda.jit(device=True)
def affine_dot(X, exponents, sums, row, packed, scales, biases, weight_row, bits, group_size):
    """One output of the exact GEMM: weight row `weight_row` against x's row `row` (fixed point), in float64."""
    per_word, mask = 32 // bits, np.uint32((1 << bits) - 1)
    groups = exponents.shape[1]
    acc, partial = 0.0, 0.0
    for g in range(groups):
        D = 0
        for c in range(g * group_size, (g + 1) * group_size):
            code = (packed[weight_row, c // per_word] >> np.uint32(bits * (c % per_word))) & mask
            D += np.int64(code) * np.int64(X[row, c])
        t = np.float64(scales[weight_row, g]) * np.float64(D) + np.float64(biases[weight_row, g]) * np.float64(
            sums[row, g])
        partial += t * math.ldexp(1.0, int(exponents[row, g]) - P)  # the groups in increasing order
        if (g + 1) * group_size % CHUNK_COLUMNS == 0 or g == groups - 1:  # a chunk's partial sum, added in order
            acc, partial = acc + partial, 0.0
    return acc


@kernel
def expert_gate_up_kernel(X, exponents, sums, ids, packed, scales, biases, bits, group_size, out):
    i = cuda.grid(1)
    width = out.shape[1]
    pair, o = i // width, i % width
    if pair < out.shape[0]:
        k = ids.shape[1]
        first = ids[pair // k, pair % k] * 2 * width  # the expert's gate rows, then its up rows
        gate = np.float32(affine_dot(X, exponents, sums, pair // k, packed, scales, biases, first + o, bits,
                                     group_size))
        up = np.float32(affine_dot(X, exponents, sums, pair // k, packed, scales, biases, first + width + o, bits,
                                   group_size))
        out[pair, o] = silu32(gate) * up


@kernel
def expert_down_kernel(X, exponents, sums, ids, packed, scales, biases, bits, group_size, out):
    i = cuda.grid(1)
    hidden = out.shape[1]
    pair, o = i // hidden, i % hidden
    if pair < out.shape[0]:
        k = ids.shape[1]
        row = ids[pair // k, pair % k] * hidden + o
        out[pair, o] = np.float32(affine_dot(X, exponents, sums, pair, packed, scales, biases, row, bits,
                                             group_size))


@kernel
def combine_kernel(routed, weights, shared, gate_logit, out):
    i = cuda.grid(1)
    hidden = out.shape[1]
    r, o = i // hidden, i % hidden
    if r < out.shape[0]:
        acc = np.float32(0)
        for n in range(weights.shape[1]):
            acc = fma32(weights[r, n], routed[r, n, o], acc)
        out[r, o] = fma32(sigmoid32(gate_logit[r, 0]), shared[r, o], acc)


# --- launchers ----------------------------------------------------------------------------------------------------

def route_launch(logits, k, stream=0):
    """`route` on device logits: (ids, weights) device arrays [rows, k]."""
    rows = logits.shape[0]
    ids = cuda.device_array((rows, k), np.int32, stream=stream)
    weights = cuda.device_array((rows, k), np.float32, stream=stream)
    route_kernel[blocks_for(rows), BLOCK, stream](logits, k, ids, weights)
    return ids, weights


def fixed_point_launch(x, group_size, stream=0):
    """x's fixed point on the device: X int32 [rows, K], exponents and sums int32 [rows, K / group_size]."""
    rows, columns = x.shape
    X = cuda.device_array((rows, columns), np.int32, stream=stream)
    exponents = cuda.device_array((rows, columns // group_size), np.int32, stream=stream)
    sums = cuda.device_array((rows, columns // group_size), np.int32, stream=stream)
    fixed_point_kernel[blocks_for(rows * (columns // group_size)), BLOCK, stream](x, group_size, X, exponents, sums)
    return X, exponents, sums


def routed_experts_launch(x, ids, gate_up, down, stream=0):
    """`routed_experts` on the device for affine expert stacks (one Linear each: gate_up [E * 2 I, hidden], down
    [E * hidden, I]): y [rows, k, hidden]."""
    rows, k = ids.shape
    hidden, width = x.shape[1], down.in_features
    fixed = fixed_point_launch(x, gate_up.group_size, stream)
    h = cuda.device_array((rows * k, width), np.float32, stream=stream)
    expert_gate_up_kernel[blocks_for(rows * k * width), BLOCK, stream](
        *fixed, ids, gate_up.data, gate_up.scales, gate_up.biases, gate_up.bits, gate_up.group_size, h)
    fixed = fixed_point_launch(h, down.group_size, stream)
    y = cuda.device_array((rows * k, hidden), np.float32, stream=stream)
    expert_down_kernel[blocks_for(rows * k * hidden), BLOCK, stream](
        *fixed, ids, down.data, down.scales, down.biases, down.bits, down.group_size, y)
    return y.reshape(rows, k, hidden)


def combine_launch(routed, weights, shared, gate_logit, stream=0):
    """`combine` on the device: out [rows, hidden]."""
    out = cuda.device_array(shared.shape, np.float32, stream=stream)
    combine_kernel[blocks_for(shared.size), BLOCK, stream](routed, weights, shared, gate_logit, out)
    return out
