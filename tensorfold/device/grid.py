"""Launch geometry shared by the kernel files: the element grid, the GPU's multiprocessors, flat views of device
arrays, integers on the device, and copying results back."""
import functools

import numpy as np
from numba import cuda

BLOCK = 256  # threads per block of the one-thread-per-element kernels


def blocks_for(n: int) -> int:
    """Blocks of BLOCK threads that cover n elements."""
    return max(1, -(-n // BLOCK))


@functools.cache
def multiprocessors() -> int:
    """The GPU's streaming multiprocessors (1 under the simulator, which has none to fill)."""
    return getattr(cuda.get_current_device(), "MULTIPROCESSOR_COUNT", 1)


def flat(a):
    """A contiguous device array as a one-dimensional view (kernels that take it form each index themselves)."""
    return a.reshape(a.size)


def device_int32(values, stream=0):
    """Integers a kernel reads: a device array as it is (a recording's buffer), host values uploaded as int32."""
    if hasattr(values, "copy_to_host"):
        return values
    return cuda.to_device(np.asarray(list(values), np.int32), stream=stream)


def to_host(outputs):
    """One device array or a tuple of them, copied back."""
    if isinstance(outputs, tuple):
        return tuple(o.copy_to_host() for o in outputs)
    return outputs.copy_to_host()
