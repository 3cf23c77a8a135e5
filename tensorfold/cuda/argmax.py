"""The argmax of each row of logits: the largest value and, among equal ones, the lowest id. It is the token at
temperature 0, and the first step of every draw (sampling.py), whose block finishes it.

Ties go towards the lower id: `better` (a larger value, or an equal one at a lower id) orders every pair of
entries, so one entry wins whatever order the comparisons take and wherever a row is cut into parts; the twin
takes the maximum and then the lowest id holding it. Logits are assumed free of NaN.

Mapping (the kernels): two launches, so that a row of Qwen3.5's vocabulary is read by many SMs, not one block.

* `argmax_part_kernel` cuts each row into up to PARTS contiguous parts, one block of THREADS threads each: thread
  t walks the part's ids t, t + THREADS, ..., LOADS loads in flight before it compares any, and keeps its first
  maximum; the block folds the THREADS (value, id) pairs in a fixed two-level order (GROUPS threads each fold GROUP
  neighbours, then one thread the GROUPS results), and each part keeps its best.
* The row's block (`argmax_kernel`, or the first step of the sample kernel) folds the parts the same way and takes
  the best part, the lowest on ties, which holds the lower ids.
"""
import numpy as np
from numba import cuda

from tensorfold.device.launch import kernel

THREADS = 256  # threads per block
GROUP = 16  # partials each first-level fold thread combines
GROUPS = THREADS // GROUP  # first-level results each second-level fold thread combines
LOADS = 16  # logits a thread loads before it compares any: one latency for 16
PARTS = 64  # blocks a row's argmax is split over, at most


def argmax(logits):
    """Index of the largest logit of each row [rows, V]; the lowest index among equal maxima.

    Thread t's partial is the first maximum among its ids t, t + THREADS, ...; the folds keep the larger value and,
    between equal values, the lower id. That rule picks one pair whatever the order of the folds, so the twin
    takes the maximum and then the lowest id holding it.
    """
    x = np.asarray(logits, np.float32)
    rows, vocab = x.shape
    length = -(-vocab // THREADS)
    padded = np.full((rows, length * THREADS), -np.inf, np.float32)
    padded[:, :vocab] = x
    step = np.argmax(padded.reshape(rows, length, THREADS), axis=1)  # thread t's first maximum: id t + THREADS*step
    ids = step * THREADS + np.arange(THREADS)
    values = np.take_along_axis(padded, ids, axis=1)
    best = values.max(axis=1, keepdims=True)
    return np.where(values == best, ids, length * THREADS).min(axis=1)


# --- the kernels --------------------------------------------------------------------------------------------------
# Block (part p, row r) of the first launch, block r of the second; thread t.

@cuda.jit(device=True)
def better(value, index, best_value, best_index):
    """Whether (value, index) beats (best_value, best_index): a larger value, or an equal one at a lower id."""
    return value > best_value or (value == best_value and index < best_index)


@cuda.jit(device=True)
def block_argmax(logits, r, t, start, stop, values, ids, group_values, group_ids):
    """The largest logit among ids start .. stop - 1 of row r and the lowest id holding it (-inf and `stop` for an
    empty range); every thread gets both."""
    best_value, best_index = np.float32(-np.inf), stop
    if start + t < stop:
        best_value, best_index = logits[r, start + t], start + t
    batch = cuda.local.array(LOADS, np.float32)
    for first in range(start + t + THREADS, stop, THREADS * LOADS):
        for u in range(LOADS):  # LOADS values in flight before the first comparison (past the end: the last)
            batch[u] = logits[r, min(first + u * THREADS, stop - 1)]
        for u in range(LOADS):
            i = first + u * THREADS
            if i < stop and batch[u] > best_value:  # ids grow along the walk, so an equal value never replaces
                best_value, best_index = batch[u], i
    values[t], ids[t] = best_value, best_index
    cuda.syncthreads()
    if t < GROUPS:
        best_value, best_index = values[t * GROUP], ids[t * GROUP]
        for i in range(t * GROUP + 1, (t + 1) * GROUP):
            if better(values[i], ids[i], best_value, best_index):
                best_value, best_index = values[i], ids[i]
        group_values[t], group_ids[t] = best_value, best_index
    cuda.syncthreads()
    if t == 0:
        best_value, best_index = group_values[0], group_ids[0]
        for g in range(1, GROUPS):
            if better(group_values[g], group_ids[g], best_value, best_index):
                best_value, best_index = group_values[g], group_ids[g]
        values[0], ids[0] = best_value, best_index
    cuda.syncthreads()
    best_value, best_index = values[0], ids[0]
    cuda.syncthreads()  # everyone has read slot 0 before a next use of the buffers
    return best_value, best_index


def argmax_parts(vocab: int) -> int:
    """Blocks a row's argmax is split over: one batch of LOADS per thread each, at most PARTS."""
    return max(1, min(PARTS, -(-vocab // (THREADS * LOADS))))


@kernel
def argmax_part_kernel(logits, part_values, part_ids):
    """Part p of row r: the best (value, id) among the row's ids [p * length, (p + 1) * length)."""
    p, r, t = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
    values = cuda.shared.array(THREADS, np.float32)
    ids = cuda.shared.array(THREADS, np.int32)
    group_values = cuda.shared.array(GROUPS, np.float32)
    group_ids = cuda.shared.array(GROUPS, np.int32)
    vocab, parts = logits.shape[1], part_values.shape[1]
    length = (vocab + parts - 1) // parts
    best_value, best_index = block_argmax(logits, r, t, min(p * length, vocab), min(p * length + length, vocab),
                                          values, ids, group_values, group_ids)
    if t == 0:
        part_values[r, p], part_ids[r, p] = best_value, best_index


@cuda.jit(device=True)
def best_of_parts(part_values, part_ids, r, t, values, ids, group_values, group_ids):
    """The row's argmax from its parts: the best part, the lowest on ties, which holds the lower ids."""
    _, best_part = block_argmax(part_values, r, t, 0, part_values.shape[1], values, ids, group_values, group_ids)
    return part_ids[r, best_part]


@kernel
def argmax_kernel(part_values, part_ids, out):
    r, t = cuda.blockIdx.x, cuda.threadIdx.x
    values = cuda.shared.array(THREADS, np.float32)
    ids = cuda.shared.array(THREADS, np.int32)
    group_values = cuda.shared.array(GROUPS, np.float32)
    group_ids = cuda.shared.array(GROUPS, np.int32)
    best = best_of_parts(part_values, part_ids, r, t, values, ids, group_values, group_ids)
    if t == 0:
        out[r] = best


def argmax_parts_launch(logits, stream=0):
    """Each row's argmax by parts (argmax_part_kernel): (best values float32, their ids int32) [rows, parts]."""
    rows, vocab = logits.shape
    parts = argmax_parts(vocab)
    part_values = cuda.device_array((rows, parts), np.float32, stream=stream)
    part_ids = cuda.device_array((rows, parts), np.int32, stream=stream)
    argmax_part_kernel[(parts, rows), THREADS, stream](logits, part_values, part_ids)
    return part_values, part_ids


def argmax_launch(logits, stream=0):
    """Row-wise argmax of device logits [rows, V]: int32 [rows] on the device."""
    out = cuda.device_array(logits.shape[0], np.int32, stream=stream)
    argmax_kernel[logits.shape[0], THREADS, stream](*argmax_parts_launch(logits, stream), out)
    return out
