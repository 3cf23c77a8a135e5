"""The checks of elementwise.py: the residual add, the MLP's gated product, and copying rows."""
import numpy as np
from numba import cuda

from tensorfold.contract import KernelCheck
from tensorfold.contract.controls import swap_rows
from tensorfold.cuda.elementwise import (
    add,
    add_kernel,
    copy_rows,
    copy_rows_kernel,
    copy_rows_launch,
    launch_elementwise,
    silu_mul,
    silu_mul_kernel,
)
from tensorfold.device.grid import to_host


def _pair_cases(mode, rng):
    shapes = [(3, 5), (2, 257)] if mode == "sim" else [(1, 1024), (16, 6144), (128, 3584), (7, 1001)]
    return [(f"{shape}", {"first": rng.normal(size=shape).astype(np.float32),
                          "second": (rng.normal(size=shape) * 8).astype(np.float32)}) for shape in shapes]


def _swap_first_elements(inputs):
    """Planted: the kernel reads element 1 of the second input for element 0 and the other way round."""
    second = inputs["second"].copy()
    flat = second.reshape(-1)
    flat[[0, 1]] = flat[[1, 0]]
    return {**inputs, "second": second}


def _pair_check(name, twin, kernel):
    return KernelCheck(
        name, twin=lambda first, second: twin(first, second),
        launch=lambda first, second: to_host(launch_elementwise(kernel, cuda.to_device(first), cuda.to_device(second))),
        cases=_pair_cases, controls={"swapped elements": _swap_first_elements}, kernels=(kernel,))


def _copy_cases(mode, rng):
    shapes = [((5, 2, 3), 2, 1)] if mode == "sim" else [((64, 8, 256), 16, 40), ((16, 128, 128), 16, 0),
                                                        ((3, 6144), 1, 2)]
    return [(f"{rows} rows of {shape} at {start}", {"dst": rng.normal(size=shape).astype(np.float32),
                                                     "src": rng.normal(size=(rows,) + shape[1:]).astype(np.float32),
                                                     "start": start}) for shape, rows, start in shapes]


CONTRACT = [
    _pair_check("add", add, add_kernel),
    _pair_check("silu_mul", silu_mul, silu_mul_kernel),
    KernelCheck("copy_rows", twin=lambda dst, src, start: copy_rows(dst.copy(), src, start),
                launch=lambda dst, src, start: to_host(copy_rows_launch(cuda.to_device(dst), cuda.to_device(src),
                                                                        start)),
                cases=_copy_cases,
                controls={"one row late": lambda i: {**i, "start": i["start"] + 1} if i["start"] + len(i["src"]) <
                          len(i["dst"]) else None, "two swapped rows": swap_rows("src")},
                kernels=(copy_rows_kernel,)),
]
