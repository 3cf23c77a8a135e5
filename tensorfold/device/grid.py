"""Launch geometry shared by the kernel files: the element grid, flat views of device arrays, and copying results
back."""

BLOCK = 256  # threads per block of the one-thread-per-element kernels


def blocks_for(n: int) -> int:
    """Blocks of BLOCK threads that cover n elements."""
    return max(1, -(-n // BLOCK))


def flat(a):
    """A contiguous device array as a one-dimensional view (kernels that take it form each index themselves)."""
    return a.reshape(a.size)


def to_host(outputs):
    """One device array or a tuple of them, copied back."""
    if isinstance(outputs, tuple):
        return tuple(o.copy_to_host() for o in outputs)
    return outputs.copy_to_host()
