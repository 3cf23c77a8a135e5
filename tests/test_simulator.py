"""The simulator's warp exchange (`warp_share`, tensorfold/device/simulator.py), on which the simulator's forms of
`shfl_xor` and `mma_s8u8` (tensorfold/cuda/ptx.py) run: each lane gets its partner's value call after call, though
a warp's two lists are reused in turn, and a block's warps exchange without waiting for each other. Under --gpu
the same kernel runs `shfl.sync` itself."""
import threading

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
    thread = threading.current_thread()
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
