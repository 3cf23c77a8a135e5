"""float32 arithmetic with one rounding, on the host: the twin side of the GPU's `fma.rn.f32`.

The product of two float32 values is exact in float64; the float64 sum is then rounded to odd where a second
rounding could go wrong, so that rounding it to float32 gives the correctly rounded exact value (Boldo and
Melquiond, "When double rounding is odd"). `tensorfold/cuda/fmath.py` holds the device side.
"""
import numba
import numpy as np

FLOAT32_TAIL = (1 << 29) - 1  # the float64 mantissa bits below float32's last one
FLOAT32_HALFWAY = 1 << 28  # those bits at a value halfway between two float32 neighbours
SMALLEST_NORMAL32 = 2.0 ** -126  # below it, float32's spacing is fixed and halfway values have other bits


@numba.njit
def add_rounded_once(p, acc):
    """acc += p in place, each sum rounded once to float32: float64 p (exact products) and float32 acc, one
    dimension each (callers pass contiguous arrays flattened). Compiled for the CPU by numba: the GEMV twin makes
    one such sum per weight and row.

    Rounding the float64 sum s to float32 goes wrong only when s sits exactly halfway between two float32 values
    and is inexact: were a halfway value strictly between s and the exact sum, it would be a float64 nearer the
    exact sum than s. Those sums (and tiny nonzero ones, whose halfway values have other bits) are rounded to odd
    first: TwoSum gives the exact error of s, and an inexact s with its last bit 0 moves one step towards the
    exact sum (consecutive floats of one sign have consecutive bit patterns). The rest take one add and one
    rounding."""
    sums = np.empty(p.size, np.float64)
    bits = sums.view(np.int64)
    for i in range(p.size):
        sums[i] = p[i] + acc[i]
    for i in range(p.size):
        s = sums[i]
        if bits[i] & FLOAT32_TAIL == FLOAT32_HALFWAY or (abs(s) < SMALLEST_NORMAL32 and s != 0):
            v = s - p[i]
            error = (p[i] - (s - v)) + (acc[i] - v)  # s + error == p + acc exactly
            if error != 0 and bits[i] & 1 == 0:  # inexact and even: one step towards the exact sum
                bits[i] += 1 if (error > 0) == (s > 0) else -1
        acc[i] = np.float32(sums[i])


def fma_rn_twin(a, b, c):
    """a * b + c rounded once to float32, on arrays or scalars (c float32): the exact float64 product, then
    `add_rounded_once` into a copy of c. (Broadcasting only when the shapes differ: the common call, an
    accumulator the products' shape, takes half the time.)"""
    p = np.multiply(a, b, dtype=np.float64)  # exact: float32 operands
    c = np.asarray(c, np.float32)
    if p.shape != c.shape:
        shape = np.broadcast_shapes(p.shape, c.shape)
        p, c = np.broadcast_to(p, shape), np.broadcast_to(c, shape)
    out = np.array(c, np.float32)  # a contiguous copy, summed into in place
    add_rounded_once(np.ascontiguousarray(p).reshape(-1), out.reshape(-1))
    return out
