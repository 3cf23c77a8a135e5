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

from tensorfold.cuda.fmath import silu32, silu32_twin
from tensorfold.device.grid import BLOCK, blocks_for
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
