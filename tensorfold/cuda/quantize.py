"""x in per-row fixed point for the exact-integer GEMM (gemm.py, whose docstring has the arithmetic): per row and group
of `group_size` columns, the exponent e of the group's largest absolute value, X = floor(x * 2^(P - e) + 0.5) in
balanced base-256 digits d0, d1, d2, and S = sum X.

The twin, `quantize_x`, runs `fixed_point` on arrays. The kernel, `quantize_kernel`, writes the digits where the
GEMM kernel's steps read them (`digit_position`: the columns in the order of the codes in a lane's words, which an
integer sum does not mind), a block per (run of whole groups, row) and a thread per QUANTIZE_COLUMNS columns, a
group's threads meeting by warp shuffles. It lets the GEMM after it launch at once (launch.let_next_launch), so that
a round's GEMM loads its weights while x is quantized (gemm.py's `round_kernel`).
"""
import functools
import math

import numpy as np
from numba import cuda

from tensorfold.cuda.ptx import FULL_WARP, shfl_xor
from tensorfold.device.grid import BLOCK
from tensorfold.device.launch import kernel_waiting_inside, let_next_launch, wait_for_inputs

P = 22  # bits of x's fixed point below its group's exponent
LIMBS = 3  # signed base-256 digits of X
QUANTIZE_COLUMNS = 8  # consecutive columns a thread of the quantize kernel reads (a group holds 4 to 16 of them)


@cuda.jit(device=True)
def fixed_point(x, scale):
    """(X, d0, d1, d2) for x scaled by `scale` = 2^(P - e): X = floor(x * scale + 0.5), exact in float64, and its
    balanced base-256 digits. Casts and arithmetic only, so the twin runs it on arrays (`fixed_point.py_func`)."""
    v = np.float64(x) * scale + 0.5
    whole = np.int64(v)  # toward zero; one less below zero where v is not whole: floor
    X = whole - np.int64(v < np.float64(whole))
    d0 = ((X + 128) & 255) - 128
    rest = (X - d0) >> 8
    d1 = ((rest + 128) & 255) - 128
    d2 = (rest - d1) >> 8
    return X, d0, d1, d2


def quantize_x(x, group_size):
    """The twin's fixed point of x [rows, K]: X float64 [rows, K], e int32 [rows, groups], S float64 [rows, groups]."""
    rows, columns = np.shape(x)
    grouped = np.asarray(x, np.float32).reshape(rows, columns // group_size, group_size)
    e = np.frexp(np.abs(grouped).max(axis=2))[1].astype(np.int32)
    X = fixed_point.py_func(grouped, np.ldexp(1.0, P - e)[:, :, None])[0].astype(np.float64)
    return X.reshape(rows, columns), e, X.sum(axis=2)


def exact_factor_bits(bits, group_size):
    """(scale bits, bias bits): the most significant bits a scale s and a bias b may have for gemm.py's products
    s * D and b * S to be exact in float64, D = sum q X and S = sum X over a group (|X| <= 2^P). The kernel's
    `s * D + b * S` compiles to one fused multiply-add, the twin's to two roundings: the same bits only where both
    products are exact. A bf16 or float16 scale (8 or 11 bits) always is; a float32 one may not be."""
    largest_d = group_size * ((1 << bits) - 1) << P
    largest_s = group_size << P
    return 53 - largest_d.bit_length(), 53 - largest_s.bit_length()


def step_shape(bits, words):
    """(columns a step covers, mmas a step: a word of 4-bit codes is one mma's two B registers, 8-bit codes need
    two words) for `words` words of codes a lane a step."""
    return 4 * words * (32 // bits), words if bits == 4 else words // 2


@cuda.jit(device=True)
def digit_position(column, bits, words):
    """Where a column's digit sits in a row of digits: step s, lane t's words (t * mmas + m) * 2 + j (the A register
    of mma m that meets B register j), byte i; the column is the code that B register's byte i holds."""
    span = 4 * words * (32 // bits)
    s, c = column // span, column % span
    if bits == 4:  # word w of the step holds columns 8 w ..; register j its codes j, j + 2, ..
        w, i, j, mmas = c // 8, c % 8 // 2, c % 2, words
        t, m = w // words, w % words
    else:  # register j of mma m is word 2 m + j of the lane's
        w, i, mmas = c // 4, c % 4, words // 2
        t, m, j = w // words, w % words // 2, w % 2
    return s * span + ((t * mmas + m) * 2 + j) * 4 + i


@functools.cache
def quantize_kernel(bits, words, group_size):
    """Block per (a run of whole groups, row) of the padded rows, thread per QUANTIZE_COLUMNS consecutive columns:
    the group's largest absolute value and S by butterfly shuffles over its threads, neighbouring lanes of one warp
    (a maximum and an integer sum: exact in any order), then the columns' digits (laid out by `digit_position` for
    steps of `words` words); rows past x's last are zero."""
    group_threads = group_size // QUANTIZE_COLUMNS
    assert group_threads & (group_threads - 1) == 0 and group_threads <= 32, "a group's threads: lanes of one warp"

    @cuda.jit(device=True)
    def group_total(value, largest):
        """The maximum (`largest`) or the sum of `value` over the thread's group, in every thread of the group. A
        block has 32 threads or more (whole warps) or fewer (one warp's first lanes), a power of two either way."""
        lanes = FULL_WARP if cuda.blockDim.x >= 32 else (1 << cuda.blockDim.x) - 1
        step = 1
        while step < group_threads:
            other = shfl_xor(value, step, np.uint32(lanes))
            value = max(value, other) if largest else value + other
            step *= 2
        return value

    @kernel_waiting_inside
    def quantize(x, digits, exponents, sums):
        let_next_launch()  # the GEMM after it loads its weights meanwhile
        wait_for_inputs()
        i = cuda.threadIdx.x
        row, first = cuda.blockIdx.y, (cuda.blockIdx.x * cuda.blockDim.x + i) * QUANTIZE_COLUMNS
        live = row < x.shape[0]
        mine = np.float32(0)
        if live:
            for k in range(first, first + QUANTIZE_COLUMNS):
                mine = max(mine, abs(x[row, k]))
        e = math.frexp(np.float64(group_total(mine, True)))[1]
        scale = math.ldexp(1.0, P - e)
        count = 0
        for k in range(first, first + QUANTIZE_COLUMNS):
            X, d0, d1, d2 = fixed_point(x[row, k] if live else np.float32(0), scale)
            at = digit_position(k, bits, words)
            digits[0, row, at], digits[1, row, at], digits[2, row, at] = d0, d1, d2
            count += X
        total = group_total(count, False)
        if i % group_threads == 0:  # the group's first thread writes its exponent and S
            exponents[row, first // group_size], sums[row, first // group_size] = e, total

    return quantize


def launch_quantize(x, bits, group_size, words, rows_pad, stream=0):
    """x's digits int8 [LIMBS, rows_pad, K] (laid out for steps of `words` words), exponents and S int32
    [rows_pad, groups], on the device."""
    columns = x.shape[1]
    groups = columns // group_size
    digits = cuda.device_array((LIMBS, rows_pad, columns), np.int8, stream=stream)
    exponents = cuda.device_array((rows_pad, groups), np.int32, stream=stream)
    sums = cuda.device_array((rows_pad, groups), np.int32, stream=stream)
    threads = math.gcd(BLOCK, columns // QUANTIZE_COLUMNS)  # whole groups a block, and no column past K
    quantize_kernel(bits, words, group_size)[(columns // QUANTIZE_COLUMNS // threads, rows_pad), threads, stream](
        x, digits, exponents, sums)
    return digits, exponents, sums
