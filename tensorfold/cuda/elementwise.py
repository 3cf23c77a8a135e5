"""Elementwise steps between the larger kernels: the residual add, the two gated products, and slicing the last
axis into a contiguous array.

    add(a, b)          = a + b                 the residual stream
    silu_mul(g, u)     = SiLU(g) * u           the SwiGLU MLP
    sigmoid_mul(x, g)  = x * sigmoid(g)        the output gate of full attention
    take_last(x, a, b) = x[..., a:b]           q | k | v out of the conv output, query | gate out of q_proj

Mapping (the kernels): one thread per output element (i = cuda.grid(1)); each element is computed alone, so
there is no order to keep.
"""
import numpy as np
from numba import cuda

from ..contract import KernelCheck
from .common import BLOCK, blocks_for, to_host
from .fmath import sigmoid32, sigmoid32_twin, silu32, silu32_twin
from .launch import kernel


def add(a, b):
    return np.add(a, b, dtype=np.float32)


def silu_mul(gate, up):
    return silu32_twin(gate) * up


def sigmoid_mul(x, gate):
    return x * sigmoid32_twin(gate)


def take_last(x, start, stop):
    return np.ascontiguousarray(x[..., start:stop])


# --- the kernels (arrays flattened to 1-D; take_last works on [vectors, width]) ------------------------------------

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
def sigmoid_mul_kernel(x, gate, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] * sigmoid32(gate[i])


@kernel
def take_last_kernel(x, start, out):
    i = cuda.grid(1)
    if i < out.size:
        vector, k = i // out.shape[1], i % out.shape[1]
        out[vector, k] = x[vector, start + k]


def launch_elementwise(kernel, first, second, stream=0):
    """Launch a two-input elementwise kernel over arrays of one shape; returns the output in that shape."""
    out = cuda.device_array(first.size, np.float32, stream=stream)
    kernel[blocks_for(first.size), BLOCK, stream](first.reshape(first.size), second.reshape(second.size), out)
    return out.reshape(first.shape)


def take_last_launch(x, start, stop, stream=0):
    width = x.shape[len(x.shape) - 1]
    vectors = x.size // width
    out = cuda.device_array((vectors, stop - start), np.float32, stream=stream)
    take_last_kernel[blocks_for(out.size), BLOCK, stream](x.reshape(vectors, width), start, out)
    return out.reshape(tuple(x.shape)[:-1] + (stop - start,))


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


def _take_cases(mode, rng):
    shapes = [((2, 3, 8), 2, 5)] if mode == "sim" else [((16, 8, 512), 0, 256), ((16, 8, 512), 256, 512),
                                                        ((128, 6144), 2048, 6144)]
    return [(f"{shape}[{a}:{b}]", {"x": rng.normal(size=shape).astype(np.float32), "start": a, "stop": b})
            for shape, a, b in shapes]


CONTRACT = [
    _pair_check("add", add, add_kernel),
    _pair_check("silu_mul", silu_mul, silu_mul_kernel),
    _pair_check("sigmoid_mul", sigmoid_mul, sigmoid_mul_kernel),
    KernelCheck("take_last", twin=take_last,
                launch=lambda x, start, stop: to_host(take_last_launch(cuda.to_device(x), start, stop)),
                cases=_take_cases,
                controls={"slice off by one": lambda i: {**i, "start": i["start"] + 1, "stop": i["stop"] + 1}}),
]
