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
expressions with NumPy. The contract sweeps every pair over the inputs the model can produce.
"""
import math
import warnings

import numpy as np
from numba import cuda

from tensorfold.contract import KernelCheck
from tensorfold.device import SIMULATED
from tensorfold.device.grid import BLOCK, blocks_for
from tensorfold.device.launch import kernel
from tensorfold.numerics.floats import fma_rn_twin


@cuda.jit(device=True)
def fma32(a, b, c):
    """a * b + c with one rounding to float32 (its body runs on NumPy arrays too: twins call fma32.py_func)."""
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


if SIMULATED:  # the simulator's cuda.fma rounds the product and the sum separately: use the twin's arithmetic
    def fma_rn(a, b, c):
        """a * b + c with one rounding to float32 (fma.rn.f32); here, the twin's emulation of it. A plain function:
        the simulator runs a device function's every call under a lock of its module, and at one call per
        multiply-add a block's threads could queue on it for the whole switch interval, call after call."""
        return np.float32(fma_rn_twin(a, b, c))
else:
    @cuda.jit(device=True)
    def fma_rn(a, b, c):
        """a * b + c with one rounding to float32: the GPU's fma.rn.f32 (all three arguments float32)."""
        return cuda.fma(a, b, c)


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


# --- the contract: every device function above, over the inputs the model can feed it ------------------------------
# One thread per input value; the twin is the same functions' py_func on the whole array.

@kernel
def transcendentals_kernel(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[0, i] = exp32(x[i])
        out[1, i] = sigmoid32(x[i])
        out[2, i] = silu32(x[i])
        out[3, i] = softplus32(x[i])
        out[4, i] = fma32(x[i], x[i], np.float32(0.5))
        out[5, i] = sqrt32(abs(x[i]))


def transcendentals(x):
    with np.errstate(over="ignore"):  # exp(89) and 3.4e38**2 overflow to inf, as on the GPU
            return np.stack([exp32_twin(x), sigmoid32_twin(x), silu32_twin(x), softplus32_twin(x),
                         fma32.py_func(x, x, np.float32(0.5)), np.sqrt(np.abs(x))])


def _sweep(mode, rng):
    """Dense sweeps where activations and gates live, random values over the whole finite range, and the edges."""
    if mode == "sim":
        dense = np.linspace(-30, 30, 301, dtype=np.float32)
        spread = rng.normal(scale=20, size=200).astype(np.float32)
    else:
        dense = np.linspace(-90, 90, 1 << 24, dtype=np.float32)  # exp overflows float32 past 88.7
        bits = rng.integers(0, 1 << 32, 1 << 22, dtype=np.uint64).astype(np.uint32).view(np.float32)
        spread = bits[np.isfinite(bits)]
    edges = np.array([0.0, -0.0, 1e-45, -1e-45, 88.72, -103.9, 20.0, 3.4e38, -3.4e38], np.float32)
    return [("sweep", {"x": np.concatenate([dense, spread, edges])})]


def _launch(x):
    out = cuda.device_array((6, x.size), np.float32)
    with warnings.catch_warnings():  # the simulator evaluates the kernel with NumPy scalars, in threads of its own,
        warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning)  # where np.errstate does not reach
        transcendentals_kernel[blocks_for(x.size), BLOCK](cuda.to_device(x), out)
    return out.copy_to_host()


def _one_ulp_up(inputs):
    """Planted: every input nudged by one ulp, as a float32 (instead of float64) evaluation would."""
    return {"x": np.nextafter(inputs["x"], np.float32(np.inf))}


@kernel
def fma_rn_kernel(a, b, c, out):
    i = cuda.grid(1)
    if i < a.size:
        out[i] = fma_rn(a[i], b[i], c[i])


def _fma_cases(mode, rng):
    """Triples where one rounding and two differ: products exactly halfway between two float32 values (a = b =
    1 + 2^-12 gives 1 + 2^-11 + 2^-24) plus a term far below float64's last bit of them, either sign or none;
    cancellations (c close to -a * b); and random triples over a wide range of magnitudes."""
    halfway = np.float32(1 + 2 ** -12)
    tiny = np.array([2.0 ** -80, -2.0 ** -80, 0.0, 2.0 ** -60, -2.0 ** -100], np.float32)
    crafted = [(np.full(tiny.size, halfway), np.full(tiny.size, halfway), tiny),
               (np.full(tiny.size, -halfway), np.full(tiny.size, halfway), -tiny)]
    n = 300 if mode == "sim" else 1 << 22
    a = (rng.normal(size=n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    b = (rng.normal(size=n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    near = (-(a.astype(np.float64) * b) * (1 + rng.normal(size=n) * 1e-7)).astype(np.float32)
    wide = (rng.normal(size=n) * np.exp2(rng.integers(-60, 20, n))).astype(np.float32)
    parts = crafted + [(a, b, near), (a, b, wide)]
    return [("halfway products, cancellations, random", {
        name: np.concatenate([part[i] for part in parts]).astype(np.float32) for i, name in enumerate("abc")})]


def _fma_launch(a, b, c):
    out = cuda.device_array(a.size, np.float32)
    fma_rn_kernel[blocks_for(a.size), BLOCK](cuda.to_device(a), cuda.to_device(b), cuda.to_device(c), out)
    return out.copy_to_host()


CONTRACT = [KernelCheck("exp32, sigmoid32, silu32, softplus32, fma32, sqrt32", transcendentals, _launch, _sweep,
                        {"inputs one ulp up": _one_ulp_up}),
            KernelCheck("fma_rn", fma_rn_twin, _fma_launch, _fma_cases,
                        {"c's sign flipped": lambda i: {**i, "c": -i["c"]}})]
