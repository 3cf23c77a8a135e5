"""Backends: where the model's operations run. The model calls ops through a backend and never imports numba.

`numpy` runs the twins of `tensorfold/cuda/` on any machine. Every backend offers the same methods with the same
arguments; arrays a backend returns are its own (NumPy arrays here).
"""
import numpy as np

from .cuda import gemv
from .cuda.attention import attention_merge, attention_partial
from .cuda.conv import causal_conv
from .cuda.deltanet import deltanet_apply, deltanet_gates, deltanet_scan
from .cuda.elementwise import add, sigmoid_mul, silu_mul, take_last
from .cuda.rmsnorm import l2norm, rmsnorm, rmsnorm_gated
from .cuda.rope import rope
from .cuda.sampling import sample
from .errors import BackendError

BACKENDS = ("numpy", "cuda", "auto")


class NumpyBackend:
    """The NumPy twins, one method per kernel family."""

    name = "numpy"

    def linear(self, x, weight):
        """x [rows, in] @ weight.T for a `Linear` in any of its forms."""
        if weight.kind == "f32":
            return gemv.gemv_f32(x, weight.data)
        if weight.kind == "bf16":
            return gemv.gemv_bf16(x, weight.data)
        return gemv.gemv_affine(x, weight.data, weight.scales, weight.biases, weight.bits, weight.group_size)

    def embed(self, ids, weight):
        return weight.rows(ids)

    rmsnorm = staticmethod(rmsnorm)
    rmsnorm_gated = staticmethod(rmsnorm_gated)
    l2norm = staticmethod(l2norm)
    causal_conv = staticmethod(causal_conv)
    deltanet_gates = staticmethod(deltanet_gates)
    deltanet_scan = staticmethod(deltanet_scan)
    deltanet_apply = staticmethod(deltanet_apply)
    rope = staticmethod(rope)
    attention_partial = staticmethod(attention_partial)
    attention_merge = staticmethod(attention_merge)
    add = staticmethod(add)
    silu_mul = staticmethod(silu_mul)
    sigmoid_mul = staticmethod(sigmoid_mul)
    take_last = staticmethod(take_last)
    sample = staticmethod(sample)

    def zeros(self, shape):
        return np.zeros(shape, np.float32)

    def upload(self, array):
        """A host array as this backend's array (NumPy: the array itself)."""
        return array

    def append_rows(self, buffer, length, rows):
        """Write `rows` at `buffer[length:]`, growing the buffer (doubling) when full; returns the buffer."""
        needed = length + len(rows)
        if needed > len(buffer):
            grown = np.zeros((max(needed, 2 * len(buffer)),) + buffer.shape[1:], buffer.dtype)
            grown[:length] = buffer[:length]
            buffer = grown
        buffer[length:needed] = rows
        return buffer

    def to_host(self, array) -> np.ndarray:
        return np.asarray(array)


def make_backend(name: str):
    """The backend called `name`: "numpy", "cuda" or "auto" (the GPU when one is usable, else NumPy)."""
    if name not in BACKENDS:
        raise BackendError(f"unknown backend {name!r}: choose one of {', '.join(BACKENDS)}")
    if name == "cuda":
        raise BackendError("backend 'cuda': the CUDA kernels are not part of this version yet; use 'numpy'")
    return NumpyBackend()
