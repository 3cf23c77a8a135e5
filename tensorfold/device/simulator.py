"""A patient block scheduler for numba's CUDA simulator, which runs every kernel of the CPU tests.

The simulator runs a block's threads as Python threads. Its scheduler (`BlockManager.run`) waits for them in a loop
that checks every thread's state again and again without pausing: while it spins it holds the interpreter lock, so
the threads it waits for barely run, and on two cores most of a kernel's time went to the loop. `install` replaces
that loop with one that makes the same decisions (release the block when every live thread waits at a barrier,
stop every thread when one raised, end when none is alive) and sleeps POLL seconds between checks while some
thread still runs. What a kernel computes, and where its threads meet, does not change; only the waiting does.

`warp_barrier` adds what the simulator lacks: a meeting of one warp's threads alone, as an instruction that takes the
whole warp (mma.sync) makes them meet on a GPU, so that warps whose work differs need not meet each other.

`unset_device_array` fills a new device array with what no kernel writes by accident (NaNs, -1, the largest
unsigned value), where the simulator's holds whatever its memory held before: often a freed array's values, even
the very values a check expects, so that an output a kernel left unwritten could pass.
"""
import threading
import time

import numpy as np

POLL = 1e-4  # seconds between two checks of a block's threads


def run_block(manager, grid_point, *args) -> None:
    """Run one block's threads to their end, as the simulator's `BlockManager.run` does, pausing between checks."""
    from numba.cuda.simulator.kernel import BlockThread
    threads = [BlockThread(lambda: manager._f(*args), manager, grid_point, block_point, manager._debug)
               for block_point in np.ndindex(*manager._block_dim)]
    for thread in threads:
        thread.start()
    live = list(threads)
    while live:
        failed = next((t for t in live if not t.syncthreads_blocked and t.exception), None)
        if failed is not None:  # stop every thread, then raise the first error seen
            for barrier in getattr(manager, "warp_barriers", {}).values():
                barrier.abort()
            for thread in threads:
                thread.abort, thread.syncthreads_blocked = True, False
                thread.syncthreads_event.set()
            raise failed.exception[0].with_traceback(failed.exception[1])
        if all(t.syncthreads_blocked for t in live):  # every live thread is at the barrier: release them together
            for thread in live:
                thread.syncthreads_blocked = False
                thread.syncthreads_event.set()
        live = [t for t in live if t.is_alive()]
        if live and not all(t.syncthreads_blocked for t in live):
            time.sleep(POLL)
    for thread in threads:
        if thread.exception:
            raise thread.exception[0].with_traceback(thread.exception[1])


_barriers_made = threading.Lock()


def warp_barrier() -> None:
    """Wait until every thread of the calling thread's warp (its block's thread ids 32 w .. 32 w + 31) arrives."""
    thread = threading.current_thread()
    manager, warp = thread._manager, thread.thread_id // 32
    with _barriers_made:
        barriers = manager.__dict__.setdefault("warp_barriers", {})
        key = (tuple(thread.blockIdx), warp)
        if key not in barriers:
            threads = int(np.prod(manager._block_dim))
            barriers[key] = threading.Barrier(min(32, threads - 32 * warp))
    barriers[key].wait()


def unset_device_array(device_array):
    """numba's `device_array` whose new arrays hold NaNs (floats), -1 (signed) or their largest value (unsigned)."""
    def make(*args, **kwargs):
        array = device_array(*args, **kwargs)
        host = array._ary
        if host.dtype.kind == "f":
            host.fill(np.nan)
        elif host.dtype.kind in "iu":
            host.fill(np.iinfo(host.dtype).max if host.dtype.kind == "u" else -1)
        return array
    return make


def install() -> None:
    """Use `run_block` for every block the simulator runs from now on, and `unset_device_array` for every device array
    made without values."""
    from numba import cuda
    from numba.cuda.simulator import kernel
    kernel.BlockManager.run = run_block
    cuda.device_array = unset_device_array(cuda.device_array)
