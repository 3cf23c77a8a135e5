"""Scalar math that rounds the same way in NumPy, in numba's CUDA simulator and on the GPU.

Two things break bit-equality between a NumPy twin and a CUDA kernel:

* NVVM fuses `a * b + c` into one fused multiply-add (one rounding) even with fastmath off, while NumPy rounds the
  product and the sum separately. `fma32` makes the fusion explicit: the product of two float32 values is exact in
  float64, so `float32(float64(a) * float64(b) + float64(c))` rounds the same on every side.
* float32 `exp`, `log`, `tanh` differ by an ulp or two between libdevice and NumPy. Every transcendental here is
  evaluated in float64 and rounded once to float32; the float64 results agree far below float32's resolution, so
  the rounded values agree except where a float64 result sits within an ulp of a float32 rounding boundary (the
  kernel tests measure how often: never, over the inputs the model produces).

The GEMV's multiply-adds, 16 rows times every weight of the model in a decode round, are too many to pay for
float64 conversions: there `fma_rn` is the GPU's own single-rounding float32 FMA (`fma.rn.f32`), and its twin
computes the same single rounding with NumPy: the float64 product is exact, and the float64 sum is *rounded to
odd* (to the neighbour whose last bit is 1 whenever the sum is inexact), after which rounding to float32 gives the
correctly rounded exact value (float64 carries more than 24 + 2 bits; Boldo and Melquiond, "When double rounding
is odd", 2005). `fma32` rounds twice (to float64, then float32), `fma_rn` once: they are different functions, each
the same on every side.

Kernels call the device functions; twins call `fma32.py_func` (its body is plain casts and arithmetic, so it
runs on arrays) and the `*_twin` array versions of the transcendentals, which evaluate the same float64
expressions with NumPy. The contract (tensorfold/contract/fmath.py) sweeps every pair over the inputs the model
can produce.
"""
import math

import numpy as np
from numba import cuda
from numba.cuda import libdevice

from tensorfold.device import SIMULATED
from tensorfold.numerics.floats import fma_rn_twin


@cuda.jit(device=True)
def fma32(a, b, c):
    """a * b + c with one rounding to float32 (its body runs on NumPy arrays too: twins call fma32.py_func)."""
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


if SIMULATED:  # the simulator's cuda.fma rounds the product and the sum separately: use the twin's arithmetic
    def fma_rn(a, b, c):
        """a * b + c with one rounding to float32 (fma.rn.f32); here, the twin's emulation of it. A plain function:
        the simulator wraps a device function's every call in a swap of its module's globals, under a lock, which at
        one call per multiply-add costs more than the arithmetic."""
        return np.float32(fma_rn_twin(a, b, c))
else:
    @cuda.jit(device=True)
    def fma_rn(a, b, c):
        """a * b + c with one rounding to float32: the GPU's fma.rn.f32 (all three arguments float32)."""
        return cuda.fma(a, b, c)


# Exact float64 values from integer bits, where a conversion instruction costs more (the exact GEMM converts an
# integer and forms a power of two for every row, output and group; a conversion to float64 is a quarter-rate
# instruction, and math.ldexp branches on overflow and subnormals). Under the simulator the bits are a NumPy view.
if SIMULATED:
    def float64_bits(bits):
        """The float64 whose bits are the int64 `bits` (a plain function: see fma_rn)."""
        return np.int64(bits).view(np.float64)
else:
    @cuda.jit(device=True)
    def float64_bits(bits):
        """The float64 whose bits are the int64 `bits`."""
        return libdevice.longlong_as_double(bits)

WHOLE = 2.0 ** 52 + 2.0 ** 51  # float64's unit is 1 from 2^52 to 2^53: WHOLE + n is exact for |n| < 2^51
WHOLE_BITS = np.int64(0x4338000000000000)  # WHOLE's bits, whose low bits n adds to make WHOLE + n


@cuda.jit(device=True)
def exact_float64(n):
    """float64(n) for an integer |n| < 2^51: an integer add into WHOLE's significand and one exact subtraction."""
    return float64_bits(WHOLE_BITS + np.int64(n)) - WHOLE


@cuda.jit(device=True)
def power_of_two(k):
    """2.0 ** k for -1022 <= k <= 1023 (a normal float64), its exponent field written directly."""
    return float64_bits((np.int64(k) + np.int64(1023)) << np.int64(52))


@cuda.jit(device=True)
def sqrt32(x):
    """sqrt(x) rounded to float32: the float64 root rounded once more equals the float32 root (float64 has more
    than twice float32's precision), so this matches np.sqrt on float32 arrays (the twins use that) and works in
    the simulator too."""
    return np.float32(math.sqrt(np.float64(x)))


# numba-cuda compiles `math` functions but not NumPy ufuncs inside kernels, so each transcendental comes as a pair:
# the device function (scalars, `math`) and its twin (arrays, NumPy), evaluating the same float64 expression.
# Arguments of exp are capped at EXP_CAP: exp(700) already rounds to float32 inf (or its reciprocal to 0), and
# the cap keeps Python's math.exp (the simulator) from raising OverflowError where the GPU returns inf.
EXP_CAP = 700.0

@cuda.jit(device=True)
def exp32(x):
    """exp(x) evaluated in float64, rounded to float32."""
    return np.float32(math.exp(min(np.float64(x), EXP_CAP)))


def exp32_twin(x):
    return np.exp(np.minimum(np.asarray(x, np.float64), EXP_CAP)).astype(np.float32)


@cuda.jit(device=True)
def sigmoid32(x):
    """1 / (1 + exp(-x)) evaluated in float64, rounded to float32."""
    return np.float32(1.0 / (1.0 + math.exp(min(-np.float64(x), EXP_CAP))))


def sigmoid32_twin(x):
    return (1.0 / (1.0 + np.exp(np.minimum(-np.asarray(x, np.float64), EXP_CAP)))).astype(np.float32)


@cuda.jit(device=True)
def silu32(x):
    """x * sigmoid(x) evaluated in float64, rounded to float32."""
    return np.float32(np.float64(x) / (1.0 + math.exp(min(-np.float64(x), EXP_CAP))))


def silu32_twin(x):
    x64 = np.asarray(x, np.float64)
    return (x64 / (1.0 + np.exp(np.minimum(-x64, EXP_CAP)))).astype(np.float32)


@cuda.jit(device=True)
def softplus32(x):
    """log(1 + exp(x)) in float64, in the overflow-free form max(x, 0) + log1p(exp(-|x|)), rounded to float32.

    PyTorch returns x itself above 20; there the float64 value is within 1e-9 of x, so it rounds to x as well.
    """
    return np.float32(max(np.float64(x), 0.0) + math.log1p(math.exp(-abs(np.float64(x)))))


def softplus32_twin(x):
    x64 = np.asarray(x, np.float64)
    return (np.maximum(x64, 0.0) + np.log1p(np.exp(-np.abs(x64)))).astype(np.float32)


def tree_sum(parts):
    """Sum the last axis (a power of two) pairwise, as a shared-memory tree: step s adds slot t + s into slot t."""
    parts = np.array(parts, dtype=np.float32, copy=True)
    width = parts.shape[-1]
    assert width & (width - 1) == 0, "a reduction tree needs a power-of-two width"
    while width > 1:
        width //= 2
        parts[..., :width] += parts[..., width:2 * width]
    return parts[..., 0]


def block_dot(a, b, threads):
    """sum(a * b) over the last axis as a block of `threads` threads computes it.

    Thread t accumulates columns t, t + threads, ... with `fma32`, then the block adds the partial sums in a tree.
    """
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    width = a.shape[-1]
    partial = np.zeros(np.broadcast_shapes(a.shape[:-1], b.shape[:-1]) + (threads,), np.float32)
    for start in range(0, width, threads):
        live = min(threads, width - start)
        partial[..., :live] = fma32.py_func(a[..., start:start + live], b[..., start:start + live], partial[..., :live])
    return tree_sum(partial)
