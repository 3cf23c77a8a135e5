"""The checks of fmath.py: every device function against its twin, over the inputs the model can feed it.

The device functions run inside other kernels; here two small kernels call them, one thread per input value, and
the twin is the same functions' array versions on the whole input.
"""
import warnings

import numpy as np
from numba import cuda

from tensorfold.contract import KernelCheck
from tensorfold.contract.controls import times
from tensorfold.cuda.fmath import (
    exp32,
    exp32_twin,
    fma32,
    fma_rn,
    sigmoid32,
    sigmoid32_twin,
    silu32,
    silu32_twin,
    softplus32,
    softplus32_twin,
    sqrt32,
)
from tensorfold.device.grid import BLOCK, blocks_for
from tensorfold.device.launch import kernel
from tensorfold.numerics.floats import fma_rn_twin


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


CONTRACT = [
    KernelCheck("exp32, sigmoid32, silu32, softplus32, fma32, sqrt32", transcendentals, _launch, _sweep,
                {"inputs one ulp up": _one_ulp_up}, kernels=(exp32, sigmoid32, silu32, softplus32, fma32, sqrt32)),
    KernelCheck("fma_rn", fma_rn_twin, _fma_launch, _fma_cases, {"c's sign flipped": times("c", -1)},
                kernels=(fma_rn,)),
]
