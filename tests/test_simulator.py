"""The simulator's block scheduler and warp exchange (tensorfold/device/simulator.py). A block's barrier waits for every
thread still running; a thread's error ends its launch, named as the simulator names it, without hanging the threads
that wait for it, and so does a wait that no thread can end. `warp_share`, on which the simulator's forms of
`shfl_xor` and `mma_s8u8` (tensorfold/cuda/ptx.py) run: each lane gets its partner's value call after call, though a
warp's two lists are reused in turn, and a block's warps exchange without waiting for each other. Under --gpu the
same kernels run `bar.sync` and `shfl.sync`."""
import numpy as np
import pytest
from numba import cuda

from tensorfold.cuda.ptx import FULL_WARP, shfl_xor
from tensorfold.device import simulator

MASKS = (1, 2, 4, 8, 16, 3, 31)  # a butterfly's partners, then two that cross several of them at once


@cuda.jit
def exchanges(values, counts, out):
    """Thread i: v = values[i], then counts[warp] times v = the partner's (3 v + step), partner lane ^ mask."""
    i = cuda.threadIdx.x
    v = values[i]
    for step in range(counts[i // 32]):
        v = shfl_xor(v * 3 + step, MASKS[step % len(MASKS)], FULL_WARP)
    out[i] = v


def expected(values, counts):
    """The exchanges in NumPy, warp by warp."""
    out = values.copy()
    lanes = np.arange(32)
    for w, count in enumerate(counts):
        v = out[32 * w:32 * w + 32]
        for step in range(count):
            v[:] = (v * 3 + step)[lanes ^ MASKS[step % len(MASKS)]]
    return out


def run(values, counts):
    out = cuda.device_array(values.size, np.int64)
    exchanges[1, values.size](cuda.to_device(values), cuda.to_device(counts), out)
    return out.copy_to_host()


SHARE = simulator.warp_share  # the exchange itself, which the planted fault wraps


def stale_share(value):
    """A planted fault: the warp's values of the exchange before this one (zeros at first), as a lane that read a list
    before its warp had met again would see them."""
    thread = simulator.RUNNING.thread
    shelf = SHARE(value)
    previous, thread.previous_shelf = getattr(thread, "previous_shelf", [0] * 32), list(shelf)
    return previous


def test_lanes_exchange_with_their_partners_and_warps_go_their_own_ways(on_gpu, monkeypatch):
    """Two warps, 17 and 4 exchanges: every lane ends with what the NumPy butterfly gives (the warps never meet each
    other, or the first would wait forever). Control: values one exchange late are caught."""
    values = np.arange(64, dtype=np.int64) * 7 - 100
    counts = np.array([17, 4], np.int32)
    assert np.array_equal(run(values, counts), expected(values, counts))
    if on_gpu:
        pytest.skip("the control plants a fault in the simulator's exchange")
    monkeypatch.setattr(simulator, "warp_share", stale_share)
    assert not np.array_equal(run(values, counts), expected(values, counts))


@cuda.jit
def neighbours(values, leavers, out):
    """Each thread writes its value plus its block's offset to shared memory, meets the block at a barrier, and reads
    its right neighbour's; threads below `leavers` return first (the barrier waits only for the threads still
    running), and each reads its neighbour again across a second barrier."""
    shared = cuda.shared.array(128, np.int64)
    i, block = cuda.threadIdx.x, cuda.blockIdx.x
    if i < leavers:
        return
    shared[i] = values[i] + 1000 * block
    cuda.syncthreads()
    out[block, 0, i] = shared[(i + 1) % cuda.blockDim.x]
    cuda.syncthreads()
    out[block, 1, i] = shared[(i + 1) % cuda.blockDim.x]


def test_a_barrier_waits_for_every_running_thread_of_its_block(on_gpu, monkeypatch):
    """Three blocks of 128 threads, the first 5 of each returning at once: every other thread but the last reads its
    neighbour's value, written before the barrier. Control: a barrier that does not wait is caught (a thread then
    reads what its neighbour left from the block or the launch before)."""
    leavers, blocks = 5, 3
    values = np.arange(128, dtype=np.int64) * 11 + 3

    def run_neighbours():
        out = cuda.to_device(np.zeros((blocks, 2, 128), np.int64))
        neighbours[blocks, 128](cuda.to_device(values), leavers, out)
        return out.copy_to_host()[:, :, leavers:127]

    def expected_neighbours():
        return np.repeat(values[None, None, leavers + 1:] + 1000 * np.arange(blocks)[:, None, None], 2, axis=1)

    assert np.array_equal(run_neighbours(), expected_neighbours())
    if on_gpu:
        pytest.skip("the control plants a fault in the simulator's barrier")
    monkeypatch.setattr(simulator.Block, "barrier", lambda block, thread: None)
    values = values + 7  # values a late read could not find left from the launch before
    assert not np.array_equal(run_neighbours(), expected_neighbours())


@cuda.jit
def fails_before_its_warp(out):
    """Lane 5 of warp 1 raises before its warp's first exchange; the others exchange and meet at a barrier."""
    i = cuda.threadIdx.x
    if i == 37:
        out[1 << 40] = 1  # past the end: the simulator raises IndexError
    v = shfl_xor(np.int64(i), 1, FULL_WARP)
    cuda.syncthreads()
    out[i] = v


def test_an_error_in_one_thread_ends_its_launch_and_names_the_thread(on_gpu):
    """The launch raises the failing thread's error, its thread and block named as the simulator names them, and
    does not hang: the block ends at the error, though a warp waits for the failed lane. The next launch runs."""
    if on_gpu:
        pytest.skip("an index past an array's end is not checked on a GPU")
    out = cuda.device_array(64, np.int64)
    with pytest.raises(IndexError, match=r"tid=\[37, 0, 0\] ctaid=\[0, 0, 0\]"):
        fails_before_its_warp[2, 64](out)
    values, counts = np.arange(64, dtype=np.int64), np.array([3, 3], np.int32)
    assert np.array_equal(run(values, counts), expected(values, counts))


@cuda.jit
def waits_for_a_lane_that_ended(out):
    """Lane 0 returns; the other 31 lanes of its warp exchange values, which needs every lane."""
    i = cuda.threadIdx.x
    if i == 0:
        return
    out[i] = shfl_xor(np.int64(i), 1, FULL_WARP)


def test_a_warp_waiting_for_a_lane_that_ended_is_an_error_not_a_hang(on_gpu):
    """A warp exchange that a lane never reaches cannot complete (on a GPU, undefined behaviour): the block ends
    with an error that says so. The next launch runs."""
    if on_gpu:
        pytest.skip("undefined behaviour on a GPU")
    with pytest.raises(RuntimeError, match="31 threads wait for threads that have ended"):
        waits_for_a_lane_that_ended[1, 32](cuda.device_array(32, np.int64))
    values, counts = np.arange(64, dtype=np.int64), np.array([2, 5], np.int32)
    assert np.array_equal(run(values, counts), expected(values, counts))

