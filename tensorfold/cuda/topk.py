"""The k best token ids of each row of logits, with their log-softmax values: what a block drafter takes from each
of its rows (its chain, or the candidates of its tree), without the logits ever leaving the device.

For one row of V logits x and k <= MAX_K:

    ids        the k largest x_i, largest first; between equal values the lower id first
    top        x[ids[0]], the row maximum
    S          sum_i exp32(x_i - top)                  float32, in the kernel's fixed order (below)
    logprob_j  x[ids[j]] - top - log(S)                 evaluated in float64, rounded once to float32

The selection only compares values, and (larger value, then lower id) orders every pair of entries, so the k best
are one set in one order whatever order the threads compare them in: the twin simply sorts the row. The sum rounds,
so the twin adds in the kernel's order.

Mapping (the kernel): one block of THREADS threads per row.

* phase 1, strided walk: thread t walks ids t, t + THREADS, ... and keeps its own k best in a sorted local list.
* phase 2, merge tree: the lists go to shared memory; at each halving step thread t < width merges list t + width
  into list t, keeping the best k. List 0 ends as the row's k best.
* phase 3, the sum: thread t adds exp32(x_i - top) over its ids in walk order; a halving tree adds the partials
  (`fmath.tree_sum`).
* phase 4: thread j < k writes id j and its log-probability.

Lists start as k placeholders (-inf, id V), which every real entry beats (a real -inf by its lower id), so a list
always holds k entries; k <= V keeps the placeholders out of the answer. Logits are assumed free of NaN.
"""
import math

import numpy as np
from numba import cuda

from tensorfold.cuda.argmax import better
from tensorfold.cuda.fmath import exp32, exp32_twin, tree_sum
from tensorfold.device.launch import kernel

THREADS = 128  # threads per block (one block per row): the walk's stride and the width of both trees
MAX_K = 32  # the largest k: the shared lists take THREADS * MAX_K * 8 bytes (32 KiB)


@cuda.jit(device=True)
def log_softmax32(value, top, total):
    """value - top - log(total) evaluated in float64, rounded once to float32."""
    return np.float32(np.float64(value) - np.float64(top) - math.log(np.float64(total)))


def log_softmax32_twin(values, top, total):
    return (np.asarray(values, np.float64) - np.asarray(top, np.float64) - np.log(np.asarray(total, np.float64))
            ).astype(np.float32)


# --- the twin ---------------------------------------------------------------------------------------------------------

def row_sums(x, top):
    """S of each row: thread t adds exp32(x_i - top) for i = t, t + THREADS, ... in turn, then the block tree."""
    rows, vocab = x.shape
    partial = np.zeros((rows, THREADS), np.float32)
    for start in range(0, vocab, THREADS):  # step n of every thread's walk: id start + t
        live = min(THREADS, vocab - start)
        partial[:, :live] += exp32_twin(x[:, start:start + live] - top[:, None])
    return tree_sum(partial)


def topk(logits, k):
    """logits [rows, V] -> (ids int32 [rows, k], logprobs float32 [rows, k]), best first, ties to the lower id."""
    x = np.asarray(logits, np.float32)
    vocab = x.shape[1]
    assert 1 <= k <= min(MAX_K, vocab), f"top-k needs 1 <= k <= min({MAX_K}, V = {vocab}), got k = {k}"
    id_grid = np.broadcast_to(np.arange(vocab), x.shape)
    ids = np.lexsort((id_grid, -x))[:, :k].astype(np.int32)  # by value descending, then id ascending
    values = np.take_along_axis(x, ids, axis=1)
    top = values[:, 0]
    total = row_sums(x, top)
    return ids, log_softmax32_twin(values, top[:, None], total[:, None])


# --- the kernel -------------------------------------------------------------------------------------------------------
# Block r handles row r; thread t. `better` (argmax.py) is the order: a larger value, or an equal one at a lower id.

@cuda.jit(device=True)
def keep_best(values, ids, k, value, index):
    """Insert (value, index) into the sorted list (values, ids)[:k] when it beats the last entry."""
    if better(value, index, values[k - 1], ids[k - 1]):
        j = k - 1
        while j > 0 and better(value, index, values[j - 1], ids[j - 1]):
            values[j], ids[j] = values[j - 1], ids[j - 1]
            j -= 1
        values[j], ids[j] = value, index


@cuda.jit(device=True)
def merge_best(list_values, list_ids, a, b, k, merged_values, merged_ids):
    """List a becomes the best k of the sorted lists a and b (through the thread's merged_* scratch lists)."""
    i, j = 0, 0
    for n in range(k):  # i + j == n < k, so neither list is read past its end
        if better(list_values[b, j], list_ids[b, j], list_values[a, i], list_ids[a, i]):
            merged_values[n], merged_ids[n] = list_values[b, j], list_ids[b, j]
            j += 1
        else:
            merged_values[n], merged_ids[n] = list_values[a, i], list_ids[a, i]
            i += 1
    for n in range(k):
        list_values[a, n], list_ids[a, n] = merged_values[n], merged_ids[n]


@kernel
def topk_kernel(logits, k, ids, logprobs):
    r, t = cuda.blockIdx.x, cuda.threadIdx.x
    vocab = logits.shape[1]
    list_values = cuda.shared.array((THREADS, MAX_K), np.float32)  # row t: thread t's k best, then merged lists
    list_ids = cuda.shared.array((THREADS, MAX_K), np.int32)
    partial = cuda.shared.array(THREADS, np.float32)
    best_values = cuda.local.array(MAX_K, np.float32)  # this thread's k best; later a merge's scratch
    best_ids = cuda.local.array(MAX_K, np.int32)
    for j in range(k):  # phase 1: the strided walk
        best_values[j], best_ids[j] = np.float32(-np.inf), vocab
    for i in range(t, vocab, THREADS):
        keep_best(best_values, best_ids, k, logits[r, i], i)
    for j in range(k):
        list_values[t, j], list_ids[t, j] = best_values[j], best_ids[j]
    width = THREADS // 2
    while width > 0:  # phase 2: the merge tree
        cuda.syncthreads()
        if t < width:
            merge_best(list_values, list_ids, t, t + width, k, best_values, best_ids)
        width //= 2
    cuda.syncthreads()
    top = list_values[0, 0]
    acc = np.float32(0)
    for i in range(t, vocab, THREADS):  # phase 3: the sum, then its tree
        acc += exp32(logits[r, i] - top)
    partial[t] = acc
    width = THREADS // 2
    while width > 0:
        cuda.syncthreads()
        if t < width:
            partial[t] += partial[t + width]
        width //= 2
    cuda.syncthreads()
    if t < k:  # phase 4
        ids[r, t] = list_ids[0, t]
        logprobs[r, t] = log_softmax32(list_values[0, t], top, partial[0])


def topk_launch(logits, k, stream=0):
    """The k best ids and their log-probabilities for each row of device logits [rows, V]: device arrays int32 and
    float32 [rows, k]."""
    rows, vocab = logits.shape
    assert 1 <= k <= min(MAX_K, vocab), f"top-k needs 1 <= k <= min({MAX_K}, V = {vocab}), got k = {k}"
    ids = cuda.device_array((rows, k), np.int32, stream=stream)
    logprobs = cuda.device_array((rows, k), np.float32, stream=stream)
    topk_kernel[rows, THREADS, stream](logits, k, ids, logprobs)
    return ids, logprobs
