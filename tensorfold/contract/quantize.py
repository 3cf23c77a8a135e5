"""The checks of quantize.py: x's digits, exponents and S in the layout the GEMM kernel reads, for a round's rows
and a prompt chunk's (padded to whole tiles of rows), against the twin's fixed point laid out by `digit_position`.
The GEMM's checks (contract/gemm.py) run the same kernel again through the products."""
import numpy as np
from numba import cuda

from tensorfold.contract import KernelCheck
from tensorfold.contract.controls import swap_rows
from tensorfold.cuda.gemm_launch import quantize_shape
from tensorfold.cuda.quantize import LIMBS, P, digit_position, fixed_point, launch_quantize, quantize_kernel, quantize_x
from tensorfold.device.grid import to_host

# (rows, columns, group size): under the simulator a round's rows and a prompt chunk's, groups of 64 and 32; on the
# GPU the 2B's hidden and MLP widths at a round's rows and a chunk's
SIM_SHAPES = [(3, 128, 64), (17, 64, 64), (2, 256, 32)]
GPU_SHAPES = [(1, 2048, 64), (16, 2048, 64), (512, 2048, 64), (1, 6144, 64), (16, 6144, 64), (100, 1024, 64)]


def _cases(bits):
    def cases(mode, rng):
        out = []
        for rows, columns, group_size in SIM_SHAPES if mode == "sim" else GPU_SHAPES:
            x = (rng.normal(size=(rows, columns)) * np.exp(rng.normal(size=(rows, 1)))).astype(np.float32)
            x[:, :group_size] = 0  # a group of zeros: X = 0 whatever its exponent
            out.append((f"{rows}x{columns}/{group_size}", {"x": x, "bits": bits, "group_size": group_size}))
        return out
    return cases


def _as_bytes(digits, exponents, sums):
    """The three outputs as arrays whose float32 view is exact (the contract compares float32 bytes)."""
    return digits.astype(np.float32), exponents.view(np.float32), sums.view(np.float32)


def _twin(x, bits, group_size, fault=None):
    rows, columns = x.shape
    words, rows_pad = quantize_shape(rows, bits, group_size, columns)
    padded = np.zeros((rows_pad, columns), np.float32)
    padded[:rows] = x
    _, e, S = quantize_x(padded, group_size)
    limbs = fixed_point.py_func(padded.reshape(rows_pad, columns // group_size, group_size),
                                np.ldexp(1.0, P - e)[:, :, None])[1:]
    digits = np.zeros((LIMBS, rows_pad, columns), np.int8)
    at = digit_position.py_func(np.arange(columns), bits, words)
    for limb in range(LIMBS):
        digits[limb][:, at] = limbs[limb].reshape(rows_pad, columns)
    return _as_bytes(digits, e, S.astype(np.int32))


def _launch(x, bits, group_size, fault=None):
    words, rows_pad = quantize_shape(x.shape[0], bits, group_size, x.shape[1])
    digits, exponents, sums = (to_host(a) for a in launch_quantize(cuda.to_device(x), bits, group_size, words,
                                                                       rows_pad))
    if fault is not None:
        digits, exponents, sums = fault(digits, exponents, sums)
    return _as_bytes(digits, exponents, sums)


def _exponent_off(digits, exponents, sums):
    exponents[0, 1] += 1
    return digits, exponents, sums


def _columns_swapped(digits, exponents, sums):
    """Row 0's last two digits in each other's place: a layout one column off."""
    digits[:, 0, [-1, -2]] = digits[:, 0, [-2, -1]]
    return digits, exponents, sums


def _limbs_swapped(digits, exponents, sums):
    return digits[[1, 0, 2]].copy(), exponents, sums


def _plant(fault):
    return lambda inputs: {**inputs, "fault": fault}


CONTRACT = [
    KernelCheck(f"quantize {bits}-bit layout", _twin, _launch, _cases(bits),
                {"two rows swapped": swap_rows("x"), "an exponent off by one": _plant(_exponent_off),
                 "two columns' digits swapped": _plant(_columns_swapped), "two limbs swapped": _plant(_limbs_swapped)},
                kernels=(quantize_kernel, fixed_point, digit_position))
    for bits in (4, 8)
]
