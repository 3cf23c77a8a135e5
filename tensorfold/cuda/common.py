"""Small helpers shared by the kernel files: the element-grid size, flat views, copying results back, and planted
controls."""
import numpy as np

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


def swap_rows(name, a=0, b=1):
    """A planted control: rows a and b of input `name` swapped (None where the input has too few rows)."""
    def plant(inputs):
        if len(inputs[name]) <= max(a, b):
            return None
        x = inputs[name].copy()
        x[[a, b]] = x[[b, a]]
        return {**inputs, name: x}
    return plant


def drop_row(name, row=-1):
    """A planted control: one row of input `name` removed (None where it has only one)."""
    def plant(inputs):
        if len(inputs[name]) < 2:
            return None
        return {**inputs, name: np.delete(inputs[name], row, axis=0)}
    return plant
