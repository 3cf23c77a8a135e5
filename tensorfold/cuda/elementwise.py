"""Elementwise steps between the larger kernels: the residual add, the MLP's gated product, and copying rows.

    add(a, b)          = a + b                 the residual stream
    silu_mul(g, u)     = SiLU(g) * u           the SwiGLU MLP
    copy_rows(d, s, a) : d[a:a + len(s)] = s   streams' rows side by side; a state written over in place

(Full attention's output gate, x * sigmoid(g), is taken in the attention merge, attention.py.)

copy_rows is a kernel rather than a driver copy so that a recorded round (graphs.py) holds nothing but launches.

Mapping (the kernels): one thread per output element (i = cuda.grid(1)); each element is computed alone, so
there is no order to keep.
"""
import numpy as np
from numba import cuda

from tensorfold.contract import KernelCheck
from tensorfold.contract.controls import swap_rows
from tensorfold.cuda.fmath import silu32, silu32_twin
from tensorfold.device.grid import BLOCK, blocks_for, to_host
from tensorfold.device.launch import kernel


def add(a, b):
    return np.add(a, b, dtype=np.float32)


def silu_mul(gate, up):
    return silu32_twin(gate) * up


def copy_rows(dst, src, start):
    dst[start:start + len(src)] = src
    return dst


# --- the kernels (arrays flattened to 1-D; copy_rows works on [rows, width]) ----------------------------------------

@kernel
def add_kernel(a, b, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a[i] + b[i]


@kernel
def silu_mul_kernel(gate, up, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = silu32(gate[i]) * up[i]


@kernel
def copy_rows_kernel(dst, src, start):
    i = cuda.grid(1)
    if i < src.size:
        row, k = i // src.shape[1], i % src.shape[1]
        dst[start + row, k] = src[row, k]


def launch_elementwise(kernel, first, second, stream=0):
    """Launch a two-input elementwise kernel over arrays of one shape; returns the output in that shape."""
    out = cuda.device_array(first.size, np.float32, stream=stream)
    kernel[blocks_for(first.size), BLOCK, stream](first.reshape(first.size), second.reshape(second.size), out)
    return out.reshape(first.shape)


def copy_rows_launch(dst, src, start, stream=0):
    """Copy device src [rows, ...] over dst[start:start + rows] (same trailing shape), in place; returns dst."""
    rows = dst.shape[0]
    if src.size:
        copy_rows_kernel[blocks_for(src.size), BLOCK, stream](dst.reshape(rows, dst.size // rows),
                                                              src.reshape(src.shape[0], src.size // src.shape[0]),
                                                              start)
    return dst


# --- the contract ---------------------------------------------------------------------------------------------------

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
        cases=_pair_cases, controls={"swapped elements": _swap_first_elements})


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
                          len(i["dst"]) else None, "two swapped rows": swap_rows("src")}),
]
