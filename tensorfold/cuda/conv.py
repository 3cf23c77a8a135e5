"""The causal depthwise convolution of DeltaNet layers, with SiLU: for each row r and channel c,

    out[r, c] = SiLU( sum_j weight[c, j] * history[taps[r, j], c] ),  j = 0 .. K - 1

where history = [tail; inputs] is the stream's tail (its last K - 1 raw inputs) followed by the window's inputs,
and taps[r] lists row r's window in it, oldest first. A chain's row r reads history[r : r + K] (taps[r, j] = r + j);
a tree's row reads its ancestors' inputs running on into the tail (`paths.conv_taps`), never a sibling's.

The new tail is the window of the last row without its oldest tap: the tail a stream has after keeping the path
to its last row (for a chain, its last K - 1 inputs).

Mapping (the kernel): one thread per (row, channel); the thread walks j in order with fma32, so the sum is the
same whatever else the round holds. K - 1 more rows of threads copy the new tail into a new array (the old tail is
still being read while they run). A one-row window can instead shift its tail in place (`in_place`, a recorded
decode round, whose replays must find the next round's tail at the same address): channel c's thread is then the
only one that reads channel c of the tail, and after its sum it moves each tail row up one, in increasing order,
so that every value is read before it is overwritten; there are no tail threads and no copy after the round.

`causal_conv_lanes` runs one row for each of several windows at once (a recorded round of one-row windows, their
tails the rows of a pool of an engine's lanes, `lanes[w]` window w's): thread (w, c) does what window w's channel
c thread does in place above, on its lane's tail.

`conv_tail_after` is the tail a stream has after keeping a path of the window (its last K - 1 inputs, running on
into the old tail), written over the old tail: what a recorded keep (model/replay.py) does with the path the walk
accepted, given padded with -1 (`paths.until_end`). Mapping: one thread per channel c, the only one to touch
channel c of the tail; it fills tail rows in increasing order, and a tail row n is only ever read for a row before
it (n' + kept = n, with n' < n), so every value is read before it is overwritten.
"""
import numpy as np
from numba import cuda

from tensorfold.cuda.fmath import fma32, silu32, silu32_twin
from tensorfold.device.grid import BLOCK, blocks_for, device_int32
from tensorfold.device.launch import kernel
from tensorfold.numerics import paths


def causal_conv(inputs, tail, weight, taps=None):
    """inputs [rows, C] after `tail` [K - 1, C]; weight [C, K]; taps [rows, K] int (by default a chain's).
    Returns (out [rows, C], new tail [K - 1, C])."""
    kernel = weight.shape[1]
    taps = paths.conv_taps(paths.chain(len(inputs)), kernel) if taps is None else taps
    history = np.concatenate([tail, inputs]).astype(np.float32)  # row r's window is history[taps[r]]
    acc = np.zeros_like(inputs, dtype=np.float32)
    for j in range(kernel):
        acc = fma32.py_func(weight[:, j], history[taps[:, j]], acc)
    return silu32_twin(acc), history[taps[-1, 1:]].copy()


def causal_conv_lanes(inputs, pool, lanes, weight):
    """One row for each window w: inputs[w] after the tail pool[lanes[w]] (pool [lanes, K - 1, C]), as
    `causal_conv` of that row alone. Returns (out [windows, C], the pool with each window's new tail in its lane's
    row)."""
    pool, out = np.array(pool, np.float32, copy=True), np.empty_like(inputs, dtype=np.float32)
    for w, lane in enumerate(np.asarray(lanes)):
        out[w:w + 1], pool[lane] = causal_conv(inputs[w:w + 1], pool[lane], weight)
    return out, pool


def conv_tail_after(tail, inputs, path):
    """The conv tail [K - 1, C] after keeping the window rows `path` (up to its first negative entry): the last K - 1
    rows of [tail; inputs[path]]."""
    kept = inputs[paths.until_end(path)]
    return np.concatenate([tail, kept])[len(kept):].astype(np.float32)


# --- the kernels --------------------------------------------------------------------------------------------------
# Thread (r, c) of a grid over [rows + K - 1, C]: rows r < rows compute output r from its window history[taps[r]];
# the K - 1 rows after them copy the last row's window, less its oldest tap, into the new tail. history =
# [tail; inputs] is never built: row n of it is tail[n] for n < K - 1 and inputs[n - K + 1] after.

@cuda.jit(device=True)
def history_at(inputs, tail, n, c):
    """Row n, channel c of [tail; inputs]."""
    if n < tail.shape[0]:
        return tail[n, c]
    return inputs[n - tail.shape[0], c]


@kernel
def causal_conv_kernel(inputs, tail, weight, taps, out, new_tail, in_place):
    i = cuda.grid(1)
    channels = inputs.shape[1]
    r, c = i // channels, i % channels
    rows, kernel = inputs.shape[0], weight.shape[1]
    if r < rows:
        acc = np.float32(0)
        for j in range(kernel):
            acc = fma32(weight[c, j], history_at(inputs, tail, taps[r, j], c), acc)
        out[r, c] = silu32(acc)
        if in_place:  # one row: tail row n takes the window's tap n + 1, read before tail row n + 1 is written
            for n in range(kernel - 1):
                tail[n, c] = history_at(inputs, tail, taps[0, n + 1], c)
    elif r < rows + kernel - 1 and not in_place:
        new_tail[r - rows, c] = history_at(inputs, tail, taps[rows - 1, r - rows + 1], c)


@kernel
def causal_conv_lanes_kernel(inputs, pool, lanes, weight, out):
    i = cuda.grid(1)
    channels = inputs.shape[1]
    w, c = i // channels, i % channels
    kernel = weight.shape[1]
    if w < inputs.shape[0]:
        tail, row = pool[lanes[w]], inputs[w:w + 1]  # window w: its one row, after its lane's tail
        acc = np.float32(0)
        for j in range(kernel):  # a one-row window's taps are history rows 0 .. K - 1
            acc = fma32(weight[c, j], history_at(row, tail, j, c), acc)
        out[w, c] = silu32(acc)
        for n in range(kernel - 1):  # tail row n takes history row n + 1, read before tail row n + 1 is written
            tail[n, c] = history_at(row, tail, n + 1, c)


@kernel
def conv_tail_after_kernel(tail, inputs, path):
    c = cuda.grid(1)
    history = tail.shape[0]
    kept = 0
    while kept < path.shape[0] and path[kept] >= 0:
        kept += 1
    if c < tail.shape[1]:
        for n in range(history):  # tail row n becomes row n + kept of [tail; inputs[path]]
            source = n + kept
            tail[n, c] = tail[source, c] if source < history else inputs[path[source - history], c]


def causal_conv_launch(inputs, tail, weight, taps=None, out=None, in_place=False, stream=0):
    """inputs [rows, C], tail [K - 1, C], weight [C, K], taps [rows, K] int32 (None: a chain's, uploaded here) on
    the device; returns (out, new tail), new arrays (out the given [rows, C] array, if one is), or, `in_place` (a
    one-row window only), the new tail written over `tail`."""
    rows, channels = inputs.shape
    kernel = weight.shape[1]
    assert rows == 1 or not in_place, "only a one-row window shifts its tail in place"
    if taps is None:
        taps = cuda.to_device(paths.conv_taps(paths.chain(rows), kernel), stream=stream)
    out = cuda.device_array((rows, channels), np.float32, stream=stream) if out is None else out
    new_tail = tail if in_place else cuda.device_array((kernel - 1, channels), np.float32, stream=stream)
    threads = (rows if in_place else rows + kernel - 1) * channels
    causal_conv_kernel[blocks_for(threads), BLOCK, stream](inputs, tail, weight, taps, out, new_tail, in_place)
    return out, new_tail


def causal_conv_lanes_launch(inputs, pool, lanes, weight, out, stream=0):
    """`causal_conv_lanes` on the device: window w's row of inputs [windows, C] into out row w, its new tail written
    over pool[lanes[w]] (lanes int32 on the device)."""
    windows, channels = inputs.shape
    assert lanes.shape[0] == windows, "one lane a window"
    causal_conv_lanes_kernel[blocks_for(windows * channels), BLOCK, stream](inputs, pool, lanes, weight, out)
    return out


def conv_tail_after_launch(tail, inputs, path, stream=0):
    """`conv_tail_after` written over `tail` [K - 1, C] on the device, for inputs [rows, C] and `path` int32 on
    the device (or a host list, uploaded); returns `tail`."""
    path = device_int32(path, stream)
    conv_tail_after_kernel[blocks_for(tail.shape[1]), BLOCK, stream](tail, inputs, path)
    return tail
