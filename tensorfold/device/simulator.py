"""What the CPU tests need of numba's CUDA simulator, which runs every kernel of theirs: a patient block scheduler,
shared arrays found cheaply, one warp's exchange, and new device arrays that show what a kernel left unwritten.

The simulator runs a block's threads as Python threads. Its scheduler (`BlockManager.run`) waits for them in a loop
that checks every thread's state again and again without pausing: while it spins it holds the interpreter lock, so
the threads it waits for barely run, and on two cores most of a kernel's time went to the loop. `install` replaces
that loop with one that makes the same decisions (release the block when every live thread waits at a barrier,
stop every thread when one raised, end when none is alive) and sleeps POLL seconds between checks while some
thread still runs. What a kernel computes, and where its threads meet, does not change; only the waiting does.

`shared_array` finds a block's shared array by the line that asks for it, as the simulator's `cuda.shared.array`
does, but from the calling frame alone: the simulator's extracts the whole stack with its source lines, in every thread
at every call.

`warp_share` adds what the simulator lacks: an exchange among one warp's threads alone, as an instruction that takes
the whole warp (mma.sync, shfl.sync) makes them meet on a GPU, so that warps whose work differs need not meet each
other. Each lane gives a value and gets every lane's, after one meeting of the warp.

`unset_device_array` fills a new device array with what no kernel writes by accident (NaNs, -1, the largest
unsigned value), where the simulator's holds whatever its memory held before: often a freed array's values, even
the very values a check expects, so that an output a kernel left unwritten could pass.
"""
import sys
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
            for warp in getattr(manager, "warps", {}).values():
                warp[0].abort()
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


_warps_made = threading.Lock()


def warp_share(value) -> list:
    """Every lane's `value` (a list, indexed by lane) once every thread of the calling thread's warp (its block's
    thread ids 32 w .. 32 w + 31) has given its own: one meeting of the warp. A warp has two lists and uses them in
    turn, so a lane may give its next value while another still reads this list: the list is written again only after
    the warp's next meeting, which every lane reaches after it has read this one."""
    thread = threading.current_thread()
    manager, key = thread._manager, (tuple(thread.blockIdx), thread.thread_id // 32)
    warp = manager.__dict__.get("warps", {}).get(key)
    if warp is None:  # the warp's first exchange: its barrier and lists made once, under the lock
        with _warps_made:
            warps = manager.__dict__.setdefault("warps", {})
            if key not in warps:
                threads = int(np.prod(manager._block_dim))
                warps[key] = (threading.Barrier(min(32, threads - 32 * key[1])), [None] * 32, [None] * 32)
            warp = warps[key]
    turn = getattr(thread, "warp_turn", 0)  # which list: every lane of the warp has made as many exchanges
    thread.warp_turn = 1 - turn
    shelf = warp[1 + turn]
    shelf[thread.thread_id % 32] = value
    warp[0].wait()
    return shelf


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


SIMULATOR_SHARED_ARRAY = None  # the simulator's own, kept by `install`


def shared_array(shared, shape, dtype, alignment=None):
    """The simulator's `cuda.shared.array` (`FakeCUDAShared.array`): one array a block for each line that asks for one
    (source file and line number, as the simulator keys them), taken from the caller's frame. The first thread to ask
    makes it; `setdefault` keeps one array if two ask at once."""
    if alignment is not None or shape == 0:  # an error, or the dynamic shared memory: the simulator's own answer
        return SIMULATOR_SHARED_ARRAY(shared, shape, dtype, alignment)
    caller = sys._getframe(1)
    key = (caller.f_code.co_filename, caller.f_lineno)
    found = shared._allocations.get(key)
    if found is None:
        from numba.cuda import types
        from numba.cuda.np import numpy_support
        dtype = numpy_support.as_dtype(dtype) if isinstance(dtype, types.Type) else dtype
        found = shared._allocations.setdefault(key, np.empty(shape, dtype))
    return found


def install() -> None:
    """Use `run_block` for every block the simulator runs from now on, `shared_array` for its shared arrays, and
    `unset_device_array` for every device array made without values."""
    global SIMULATOR_SHARED_ARRAY
    from numba import cuda
    from numba.cuda.simulator import kernel, kernelapi
    kernel.BlockManager.run = run_block
    if SIMULATOR_SHARED_ARRAY is None:
        SIMULATOR_SHARED_ARRAY = kernelapi.FakeCUDAShared.array
        kernelapi.FakeCUDAShared.array = shared_array
    cuda.device_array = unset_device_array(cuda.device_array)
