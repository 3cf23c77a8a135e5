"""What the CPU tests need of numba's CUDA simulator, which runs every kernel of theirs: a block scheduler that neither spins nor starts a thread a block,
shared arrays found cheaply, one warp's exchange, and new device arrays that show what a kernel left unwritten.

The simulator runs a block's threads as Python threads. Its scheduler (`BlockManager.run`) starts a new Python thread
for every simulated thread of every block, and waits for them in a loop that checks every thread's state again and
again: while it spins it holds the interpreter lock, so the threads it waits for barely run. `install` replaces it with
`run_block`: the threads of a block meet at a barrier that the last live thread to arrive releases (`Block`), and the
Python threads are started once and reused, block after block (`Worker`). The same decisions (release the block when
every live thread waits at the barrier, abort every thread at its next barrier when one raised, raise the first error,
end when none is alive); what a kernel computes, and where its threads meet, does not change.

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

import numpy as np


class GpuThread:
    """What the simulator's kernel API asks of `threading.current_thread()` while a block runs (its ids and
    `syncthreads`), kept on a Python thread that `run_block` hands one simulated thread after another."""

    def bind(self, block, block_point) -> None:
        """Make this Python thread simulate thread `block_point` of `block`."""
        from numba.cuda.simulator.kernelapi import Dim3  # imported here: on a GPU the simulator is never loaded
        self.block, self.debug = block, block.manager._debug
        self.blockIdx, self.threadIdx = Dim3(*block.grid_point), Dim3(*block_point)
        x, y, _ = block.manager._block_dim
        self.thread_id = block_point[0] + x * (block_point[1] + y * block_point[2])
        self.exception, self.warp_turn = None, 0

    def syncthreads(self) -> None:
        self.block.barrier()

    def syncthreads_count(self, value):
        return self.block.vote(self.threadIdx, value, np.count_nonzero)

    def syncthreads_and(self, value):
        return self.block.vote(self.threadIdx, value, lambda state: int(np.all(state)))

    def syncthreads_or(self, value):
        return self.block.vote(self.threadIdx, value, lambda state: int(np.any(state)))


class Worker(threading.Thread, GpuThread):
    """A Python thread that runs simulated threads one after another: started once, then reused, since starting a
    Python thread costs more than most simulated threads' work."""

    def __init__(self):
        super().__init__(daemon=True)
        self.work = threading.Semaphore(0)

    def run(self) -> None:
        while True:
            self.work.acquire()
            try:
                if self.debug:
                    np.seterr(divide="raise")
                self.block.manager._f(*self.block.args)
            except Exception as error:  # the simulator's message: the thread and block ids, then the error's own
                where = f"tid={list(self.threadIdx)} ctaid={list(self.blockIdx)}"
                self.exception = (type(error)(f"{where}: {error}" if str(error) else where), sys.exc_info()[2])
            self.block.leave(self)  # then `run_block` may let go of the block: nothing here holds it while idle


class Block:
    """One block's run: its barrier, which the last live thread to arrive releases (a thread that has ended no longer
    counts), and its end, which the last thread to leave announces. A thread that raised aborts the others at their
    next barrier, as the simulator's scheduler does, and `run_block` raises the first error."""

    def __init__(self, manager, grid_point, args, size):
        self.manager, self.grid_point, self.args = manager, grid_point, args
        self.met = threading.Condition()
        self.size, self.live, self.arrived, self.meetings = size, size, 0, 0
        self.warps = {}  # warp -> its barrier and two lists (`warp_share`)
        self.error = None
        self.done = threading.Event()

    def barrier(self) -> None:
        with self.met:
            if self.error is not None:
                raise RuntimeError("abort flag set on syncthreads call")
            self.arrived += 1
            if self.arrived == self.live:
                self.release()
            else:
                meeting = self.meetings
                while meeting == self.meetings and self.error is None:
                    self.met.wait()
            if self.error is not None:
                raise RuntimeError("abort flag set on syncthreads clear")

    def vote(self, thread_index, value, count):
        """`count` of every thread's value: the values written, a barrier, the count read, a barrier."""
        self.manager.block_state[tuple(thread_index)] = value
        self.barrier()
        result = count(self.manager.block_state)
        self.barrier()
        return result

    def warp(self, index):
        """Warp `index`'s barrier and lists, made by the first lane that asks; none once a thread has raised, since
        that thread's warp would wait for it forever."""
        with self.met:
            if self.error is not None:
                raise RuntimeError("abort flag set on a warp's exchange")
            if index not in self.warps:
                self.warps[index] = (threading.Barrier(min(32, self.size - 32 * index)), [None] * 32, [None] * 32)
            return self.warps[index]

    def release(self) -> None:
        self.arrived, self.meetings = 0, self.meetings + 1
        self.met.notify_all()

    def leave(self, thread) -> None:
        """`thread` has ended (its `exception` set if it raised)."""
        with self.met:
            self.live -= 1
            if thread.exception is not None and self.error is None:
                self.error = thread.exception
                for warp in self.warps.values():  # a lane waiting for its warp gives up
                    warp[0].abort()
                self.met.notify_all()
            elif self.live and self.arrived == self.live:  # the threads still running all wait at the barrier
                self.release()
            if self.live == 0:
                self.done.set()


IDLE_WORKERS = []  # workers whose last block has ended (a list's pop and extend are atomic: no lock needed)


def idle_worker() -> Worker:
    """A worker whose last block has ended, or a new one."""
    try:
        return IDLE_WORKERS.pop()
    except IndexError:
        worker = Worker()
        worker.start()
        return worker


def run_block(manager, grid_point, *args) -> None:
    """Run one block's threads to their end, as the simulator's `BlockManager.run` does, on reused workers."""
    points = list(np.ndindex(*manager._block_dim))
    block = Block(manager, grid_point, args, len(points))
    workers = [idle_worker() for _ in points]
    for worker, point in zip(workers, points):
        worker.bind(block, point)
        worker.work.release()
    block.done.wait()
    for worker in workers:
        worker.block = None  # the block's arguments are not kept alive by an idle worker
    IDLE_WORKERS.extend(workers)
    if block.error is not None:
        raise block.error[0].with_traceback(block.error[1])


def warp_share(value) -> list:
    """Every lane's `value` (a list, indexed by lane) once every thread of the calling thread's warp (its block's
    thread ids 32 w .. 32 w + 31) has given its own: one meeting of the warp. A warp has two lists and uses them in
    turn, so a lane may give its next value while another still reads this list: the list is written again only after
    the warp's next meeting, which every lane reaches after it has read this one."""
    thread = threading.current_thread()
    block, index = thread.block, thread.thread_id // 32
    warp = block.warps.get(index) or block.warp(index)
    turn = thread.warp_turn  # which list: every lane of the warp has made as many exchanges
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
