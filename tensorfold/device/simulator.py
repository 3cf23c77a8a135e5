"""A patient block scheduler for numba's CUDA simulator, which runs every kernel of the CPU tests.

The simulator runs a block's threads as Python threads. Its scheduler (`BlockManager.run`) waits for them in a loop
that checks every thread's state again and again without pausing: while it spins it holds the interpreter lock, so
the threads it waits for barely run, and on two cores most of a kernel's time went to the loop. `install` replaces
that loop with one that makes the same decisions (release the block when every live thread waits at a barrier,
stop every thread when one raised, end when none is alive) and sleeps POLL seconds between checks while some
thread still runs. What a kernel computes, and where its threads meet, does not change; only the waiting does.
"""
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


def install() -> None:
    """Use `run_block` for every block the simulator runs from now on."""
    from numba.cuda.simulator import kernel
    kernel.BlockManager.run = run_block
