"""The checks of rmsnorm.py: the plain, residual and gated norms, whole rows and per head."""
import numpy as np
from numba import cuda

from tensorfold.contract import KernelCheck
from tensorfold.contract.controls import swap_rows, times
from tensorfold.cuda.rmsnorm import (
    add_rmsnorm,
    add_rmsnorm_kernel,
    add_rmsnorm_launch,
    rmsnorm,
    rmsnorm_gated,
    rmsnorm_gated_kernel,
    rmsnorm_gated_launch,
    rmsnorm_kernel,
    rmsnorm_launch,
)
from tensorfold.device.grid import to_host


def _cases(mode, rng):
    """(rows, vectors per row, width): whole rows of D, and the per-head norms (q/k norms, DeltaNet heads); a row
    longer than one batch a thread (THREADS * LOADS: the 4B's 2,560 on GPU) takes add_rmsnorm's other path."""
    shapes = [(3, 1, 40), (2, 3, 130), (2, 1, 2100)] if mode == "sim" else [
        (1, 1, 1024), (16, 1, 2048), (128, 1, 1024), (16, 8, 256), (5, 16, 128), (3, 1, 1000), (4, 1, 2560)]
    cases = []
    for rows, vectors, width in shapes:
        x = rng.normal(size=(rows, vectors, width)).astype(np.float32)
        z = rng.normal(size=(rows, vectors, width)).astype(np.float32)
        cases.append((f"{rows}x{vectors}x{width}", {"x": x, "z": z, "multiplier": (1 + rng.normal(size=width) * 0.3)
                                                    .astype(np.float32), "eps": 1e-6}))
    return cases


_CONTROLS = {"two swapped rows": swap_rows("x"), "eps off by a factor of ten": times("eps", 10)}
CONTRACT = [
    KernelCheck("rmsnorm", lambda x, z, multiplier, eps: rmsnorm(x, multiplier, eps),
                lambda x, z, multiplier, eps: to_host(rmsnorm_launch(
                    cuda.to_device(x), cuda.to_device(multiplier), eps)),
                _cases, _CONTROLS, kernels=(rmsnorm_kernel,)),
    KernelCheck("add_rmsnorm", lambda x, z, multiplier, eps: add_rmsnorm(x, z, multiplier, eps),
                lambda x, z, multiplier, eps: to_host(add_rmsnorm_launch(
                    cuda.to_device(x), cuda.to_device(z), cuda.to_device(multiplier), eps)),
                _cases, {**_CONTROLS, "the sum of another row": swap_rows("z")}, kernels=(add_rmsnorm_kernel,)),
    KernelCheck("rmsnorm_gated", rmsnorm_gated,
                lambda x, z, multiplier, eps: to_host(rmsnorm_gated_launch(
                    cuda.to_device(x), cuda.to_device(z), cuda.to_device(multiplier), eps)),
                _cases, {**_CONTROLS, "gate of another row": swap_rows("z")}, kernels=(rmsnorm_gated_kernel,)),
]
