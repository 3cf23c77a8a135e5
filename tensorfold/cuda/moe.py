"""The sparse MoE block's own steps around the routed experts (experts.py): the router and the weighted sum.

    route(logits, k)        p = softmax(logits) in float32; the k largest p, best first (ties: the lower expert);
                            weights w = p_chosen / sum(p_chosen)
    combine(y, w, s, g)     out[r] = sum over n in rank order of w[r, n] * y[r, n], then + sigmoid(g[r]) * s[r]

The router's sums run over the experts in increasing order, and every choice compares (p, expert) in one total
order, so a row's choice is fixed by its logits alone. The softmax's exp is `exp32` (float64, rounded once). The
ids stay on the device for the routed experts' grouped GEMM (experts.py), y [rows, k, hidden] its output.

The weighted sum is `fma32` (float64, rounded once) rank by rank, the highest weight first, then the shared
expert's output times its gate.

Mappings: `route_kernel` one thread a row; `combine_kernel` one thread a (row, hidden output).
"""
import numpy as np
from numba import cuda

from tensorfold.cuda.fmath import exp32, exp32_twin, fma32, sigmoid32, sigmoid32_twin
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


def combine_launch(routed, weights, shared, gate_logit, stream=0):
    """`combine` on the device: out [rows, hidden]."""
    out = cuda.device_array(shared.shape, np.float32, stream=stream)
    combine_kernel[blocks_for(shared.size), BLOCK, stream](routed, weights, shared, gate_logit, out)
    return out
