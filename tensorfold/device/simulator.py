"""What the CPU tests need of numba's CUDA simulator, which runs every kernel of theirs: a block's threads run as
greenlets, shared arrays found cheaply, one warp's exchange, and new device arrays that show what a kernel left
unwritten.

The simulator runs a block's threads as Python threads: its scheduler (`BlockManager.run`) starts one for every
simulated thread of every block and polls them until they end, meeting at each barrier. On two cores most of a
kernel's time went to starting threads, to the operating system's switches between them and to the interpreter lock
they hand each other. `install` replaces it with `run_block`: a block's threads are greenlets of the launching thread
(`SimulatedThread`), which switch only where a thread waits (at the barrier, for its warp) or ends, and `Block.run`
takes the threads that are ready one after another. The same decisions (the barrier waits for every thread still
running, the first error ends the block and is raised); one thread runs at a time, as the simulator's ran one at a time
under the interpreter lock, so what a kernel computes, and where its threads meet, does not change. The simulator's
kernel API finds the running thread's ids in `RUNNING.thread`, where it asked `threading.current_thread()`.

`shared_array` finds a block's shared array by the line that asks for it, as the simulator's `cuda.shared.array`
does, but from the calling frame alone: the simulator's extracts the whole stack with its source lines, in every thread
at every call.

`warp_share` adds what the simulator lacks: an exchange among one warp's threads alone, as an instruction that takes
the whole warp (mma.sync, shfl.sync) makes them meet on a GPU, so that warps whose work differs need not meet each
other. Each lane gives a value and gets every lane's, after one meeting of the warp.

`address` gives a device array's place in memory, so that the simulator's forms of vector loads can refuse one that
the GPU's would fault on.

`unset_device_array` fills a new device array with what no kernel writes by accident (NaNs, -1, the largest
unsigned value), where the simulator's holds whatever its memory held before: often a freed array's values, even
the very values a check expects, so that an output a kernel left unwritten could pass.
"""
import collections
import sys
import threading

import numpy as np

# .thread: the simulated thread that runs now in this Python thread; the simulator's kernel API reads its ids from it
# (`install`), where it read them from the Python thread itself.
RUNNING = threading.local()


class SimulatedThread:
    """One thread of a block: its ids, and the greenlet that runs the kernel for it."""

    def __init__(self, block, block_index, thread_index, thread_id, greenlet_type):
        self.block, self.blockIdx, self.threadIdx, self.thread_id = block, block_index, thread_index, thread_id
        self.warp_turn = 0  # which of its warp's two lists the next exchange uses (`warp_share`)
        self.greenlet = greenlet_type(self.run, parent=block.scheduler)

    def run(self) -> None:
        manager = self.block.manager
        try:
            if manager._debug:
                np.seterr(divide="raise")
            manager._f(*self.block.args)
        except Exception as error:  # the simulator's message: the thread and block ids, then the error's own
            where = f"tid={list(self.threadIdx)} ctaid={list(self.blockIdx)}"
            self.block.error = (type(error)(f"{where}: {error}" if str(error) else where), sys.exc_info()[2])

    # what the simulator's kernel API calls on the current thread
    def syncthreads(self) -> None:
        self.block.barrier(self)

    def syncthreads_count(self, value):
        return self.block.vote(self, value, np.count_nonzero)

    def syncthreads_and(self, value):
        return self.block.vote(self, value, lambda state: int(np.all(state)))

    def syncthreads_or(self, value):
        return self.block.vote(self, value, lambda state: int(np.any(state)))


class Block:
    """One block's run. `run` takes the threads that are ready one after another and runs each until it waits (at the
    barrier, or for its warp) or ends; a meeting that every thread it waits for has reached makes its threads ready
    again, in the order they arrived. The barrier waits for every thread still running (a thread that has ended no
    longer counts), as the simulator's does. The first error ends the block, and `run` raises it."""

    def __init__(self, manager, grid_point, args):
        import greenlet  # imported here, as the simulator is: on a GPU no block runs here
        from numba.cuda.simulator.kernelapi import Dim3
        self.manager, self.grid_point, self.args = manager, grid_point, args
        self.scheduler = greenlet.getcurrent()  # where a thread that waits or ends goes back to
        x, y, _ = manager._block_dim
        block_index = Dim3(*grid_point)
        self.threads = [SimulatedThread(self, block_index, Dim3(*point), point[0] + x * (point[1] + y * point[2]),
                                        greenlet.greenlet) for point in np.ndindex(*manager._block_dim)]
        self.ready = collections.deque(self.threads)
        self.live = len(self.threads)
        self.at_barrier = []
        self.warps = {}  # warp -> the lanes waiting for it and its two lists (`warp_share`)
        self.error = None

    def run(self) -> None:
        while self.ready and self.error is None:
            thread = RUNNING.thread = self.ready.popleft()
            thread.greenlet.switch()
            if thread.greenlet.dead:
                self.live -= 1
                if self.at_barrier and len(self.at_barrier) == self.live:  # the threads still running all wait there
                    self.release(self.at_barrier)
        RUNNING.thread = None
        if self.error is not None:
            raise self.error[0].with_traceback(self.error[1])
        if self.live:
            raise RuntimeError(f"block {list(self.grid_point)}: {self.live} threads wait for threads that have ended "
                               "(a barrier or a warp exchange that not every thread reaches)")

    def release(self, waiting: list) -> None:
        self.ready.extend(waiting)
        waiting.clear()

    def wait(self) -> None:
        """The calling thread waits: the scheduler runs the others until a meeting makes it ready again."""
        self.scheduler.switch()

    def barrier(self, thread) -> None:
        self.at_barrier.append(thread)
        if len(self.at_barrier) == self.live:
            self.release(self.at_barrier)
        self.wait()

    def vote(self, thread, value, count):
        """`count` of every thread's value: the values written, a barrier, the count read, a barrier."""
        self.manager.block_state[tuple(thread.threadIdx)] = value
        self.barrier(thread)
        result = count(self.manager.block_state)
        self.barrier(thread)
        return result

    def warp(self, index) -> tuple:
        """Warp `index`'s waiting lanes, its lane count and its two lists, made at its first exchange."""
        if index not in self.warps:
            self.warps[index] = ([], min(32, len(self.threads) - 32 * index), [None] * 32, [None] * 32)
        return self.warps[index]


def run_block(manager, grid_point, *args) -> None:
    """Run one block's threads to their end, as the simulator's `BlockManager.run` does, as greenlets of the calling
    thread."""
    Block(manager, grid_point, args).run()


def warp_share(value) -> list:
    """Every lane's `value` (a list, indexed by lane) once every thread of the calling thread's warp (its block's
    thread ids 32 w .. 32 w + 31) has given its own: one meeting of the warp. A warp has two lists and uses them in
    turn, so a lane may give its next value while another still reads this list: the list is written again only after
    the warp's next meeting, which every lane reaches after it has read this one."""
    thread = RUNNING.thread
    waiting, lanes, *shelves = thread.block.warp(thread.thread_id // 32)
    shelf = shelves[thread.warp_turn]
    thread.warp_turn = 1 - thread.warp_turn
    shelf[thread.thread_id % 32] = value
    waiting.append(thread)
    if len(waiting) == lanes:
        thread.block.release(waiting)
    thread.block.wait()
    return shelf


def address(array) -> int:
    """Where a simulated device array's first element lies in memory, as a GPU's load would see its pointer: the NumPy
    array under the simulator's wrappers (a kernel's argument wraps the device array, which wraps its host array)."""
    while not isinstance(array, np.ndarray):
        inside = vars(array)
        array = inside["_item"] if "_item" in inside else inside["_ary"]
    return array.ctypes.data


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
    makes it."""
    if alignment is not None or shape == 0:  # an error, or the dynamic shared memory: the simulator's own answer
        return SIMULATOR_SHARED_ARRAY(shared, shape, dtype, alignment)
    caller = sys._getframe(1)
    key = (caller.f_code.co_filename, caller.f_lineno)
    found = shared._allocations.get(key)
    if found is None:
        from numba.cuda import types
        from numba.cuda.np import numpy_support
        dtype = numpy_support.as_dtype(dtype) if isinstance(dtype, types.Type) else dtype
        found = shared._allocations[key] = np.empty(shape, dtype)
    return found


def install() -> None:
    """Use `run_block` for every block the simulator runs from now on, with the thread ids and barriers of
    `RUNNING.thread` where the simulator's kernel API asked `threading.current_thread()`, `shared_array` for its shared
    arrays, and `unset_device_array` for every device array made without values."""
    global SIMULATOR_SHARED_ARRAY
    from numba import cuda
    from numba.cuda.simulator import kernel, kernelapi
    kernel.BlockManager.run = run_block
    api = kernelapi.FakeCUDAModule
    api.threadIdx = property(lambda module: RUNNING.thread.threadIdx)
    api.blockIdx = property(lambda module: RUNNING.thread.blockIdx)
    api.laneid = property(lambda module: RUNNING.thread.thread_id % 32)
    api.syncthreads = kernelapi.GridGroup.sync = lambda module: RUNNING.thread.syncthreads()
    api.syncthreads_count = lambda module, value: RUNNING.thread.syncthreads_count(value)
    api.syncthreads_and = lambda module, value: RUNNING.thread.syncthreads_and(value)
    api.syncthreads_or = lambda module, value: RUNNING.thread.syncthreads_or(value)
    if SIMULATOR_SHARED_ARRAY is None:
        SIMULATOR_SHARED_ARRAY = kernelapi.FakeCUDAShared.array
        kernelapi.FakeCUDAShared.array = shared_array
    cuda.device_array = unset_device_array(cuda.device_array)
