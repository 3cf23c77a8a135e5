"""A caching allocator for the `cuda` backend: device memory a round frees is handed to the next round's arrays.

Every op of a round allocates its output, and numba's own memory manager frees device memory with `cuMemFree`,
batched ten frees at a time. `cuMemFree` waits for the whole device to finish its queued work, so every few
launches the host stops and waits for the GPU: the host's launch time and the GPU's run time add up instead of
overlapping. This pool never calls `cuMemFree` while it serves: a freed block goes back on the free list of its
size class and the next allocation of that class takes it.

Reuse is safe because the backend issues every launch and copy on one stream: a block handed out again is only
written by work queued after the work that last read it. The pool is a numba External Memory Management plugin
(numba.cuda.set_memory_manager); it must be installed before the process creates its CUDA context.
"""
import collections
import weakref

from numba import cuda
from numba.cuda.cudadrv import driver as cuda_driver

GRANULE = 512  # bytes: sizes round up to a multiple of this, so a freed block fits the next array of its class
SIZE_CLASSES_PER_DOUBLING = 4  # above 64 KiB, four classes per power of two: at most 25% of a block is slack


def size_class(size: int) -> int:
    """The block size that serves a request of `size` bytes."""
    size = max(GRANULE, -(-size // GRANULE) * GRANULE)
    if size <= 1 << 16:
        return size
    step = (1 << (size.bit_length() - 1)) // SIZE_CLASSES_PER_DOUBLING
    return -(-size // step) * step


class CachingMemoryManager(cuda_driver.GetIpcHandleMixin, cuda_driver.HostOnlyCUDAMemoryManager):
    """numba's device memory manager with a free list per size class instead of `cuMemFree`."""

    instances = weakref.WeakSet()  # this process's managers (numba makes one a context), for `release_cached`

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        CachingMemoryManager.instances.add(self)
        self.free = collections.defaultdict(list)  # size class -> device pointers ready to hand out
        self.held = 0  # bytes allocated from the driver and not returned to it

    def initialize(self):
        if self.deallocations.memory_capacity == cuda_driver._SizeNotSet:  # as numba's own manager does
            self.deallocations.memory_capacity = self.get_memory_info().total

    def memalloc(self, size):
        block = size_class(size)
        if self.free[block]:
            pointer = self.free[block].pop()
        else:
            pointer = self._from_driver(block)
        memory = cuda_driver.AutoFreePointer(weakref.proxy(self.context), pointer, size,
                                             finalizer=self._finalizer(pointer, block))
        self.allocations[pointer] = memory  # alive until the last array on it is gone (numba's owners hold weak refs)
        return memory.own()

    def _finalizer(self, pointer, block: int):
        """What runs when the last array on a block is gone: the block goes back on its free list."""
        allocations, free_list = self.allocations, self.free[block]

        def back_to_the_pool():
            allocations.pop(pointer, None)
            free_list.append(pointer)
        return back_to_the_pool

    def _from_driver(self, block: int):
        """A new block from cuMemAlloc; when the device is full, the cached blocks go back first."""
        try:
            pointer = cuda_driver.driver.cuMemAlloc(block)
        except cuda_driver.CudaAPIError as error:
            if error.code != cuda_driver.binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
                raise
            self.release()
            pointer = cuda_driver.driver.cuMemAlloc(block)
        self.held += block
        return pointer

    def release(self) -> None:
        """Return every cached block to the driver (after the device has finished with them)."""
        cuda_driver.driver.cuCtxSynchronize()
        for block, pointers in self.free.items():
            for pointer in pointers:
                cuda_driver.driver.cuMemFree(pointer)
            self.held -= block * len(pointers)
            pointers.clear()

    def get_memory_info(self):
        free, total = cuda_driver.driver.cuMemGetInfo()
        return cuda_driver.MemoryInfo(free=free, total=total)

    def reset(self):
        self.release()
        super().reset()

    @property
    def interface_version(self):
        return 1


def release_cached() -> int:
    """Return the blocks every pool of this process holds for reuse to the driver; the bytes returned. Processes
    that share a GPU (test workers) otherwise keep memory the others cannot have: a pool gives its blocks back
    only when its own allocation fails."""
    returned = 0
    for manager in list(CachingMemoryManager.instances):
        held = manager.held
        manager.release()
        returned += held - manager.held
    return returned


def install() -> bool:
    """Make the pool numba's memory manager and create the CUDA context; whether the context uses the pool (not
    when the process had created its context before: that one keeps numba's manager)."""
    cuda.set_memory_manager(CachingMemoryManager)
    return isinstance(cuda.current_context().memory_manager, CachingMemoryManager)
