"""Backends: where the model's operations run. The model calls ops through a backend and never imports numba.

* `numpy` (numpy_backend.py) runs the twins of `tensorfold/cuda/` on any machine.
* `cuda` (cuda_backend.py) runs the kernels beside them on the GPU, or on the CPU under numba's CUDA simulator.
* `auto` picks `cuda` when a real GPU is usable, else `numpy`.

Both implement `ops.Ops`, the same methods with the same parameters; the arrays a backend returns are its own.
"""
from tensorfold.backends.cuda_backend import CudaBackend
from tensorfold.backends.numpy_backend import NumpyBackend
from tensorfold.backends.ops import DeviceOps, Ops
from tensorfold.device import SIMULATED
from tensorfold.errors import BackendError

__all__ = ["BACKENDS", "CudaBackend", "DeviceOps", "NumpyBackend", "Ops", "make_backend"]

BACKENDS = ("numpy", "cuda", "auto")


def make_backend(name: str) -> Ops:
    """The backend called `name`: "numpy", "cuda" or "auto" (the GPU when one is usable, else NumPy)."""
    if name not in BACKENDS:
        raise BackendError(f"unknown backend {name!r}: choose one of {', '.join(BACKENDS)}")
    if name == "auto":
        from numba import cuda
        return CudaBackend() if cuda.is_available() and not SIMULATED else NumpyBackend()
    return CudaBackend() if name == "cuda" else NumpyBackend()
