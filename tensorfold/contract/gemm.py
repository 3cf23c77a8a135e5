"""The checks of gemm.py: the exact-integer GEMM of MLX affine weights (a round's rows and prompt chunks), in parts
and gated. The planted faults that live inside the arithmetic (a group dropped, two digits swapped, an exponent off
by one, a row scaled by another row's exponent) are planted in x's quantized form between the two kernels."""
import numpy as np
from numba import cuda

from tensorfold.contract import KernelCheck
from tensorfold.contract.controls import swap_rows
from tensorfold.cuda.gemm import (combine_kernel, finish_output, gemm_affine, gemm_kernel, lane_rows, round_kernel,
                                  round_tile, whole_bases, whole_kernel, whole_tile)
from tensorfold.cuda.gemm_launch import launch_products, quantize_shape
from tensorfold.cuda.gemv import output_index, swiglu
from tensorfold.cuda.ptx import load_words
from tensorfold.cuda.quantize import digit_position, fixed_point, launch_quantize, quantize_kernel
from tensorfold.device.grid import to_host
from tensorfold.numerics.formats import bf16_to_f32, f32_to_bf16

# (rows, outputs, columns): under the simulator a round's rows and a prompt chunk's; on the GPU every projection of
# Qwen3.5-2B (hidden 2048) at 1, 16 and 512 rows, odd sizes, and the head. Each call takes the kernel its launcher
# picks, and the shapes of WHOLE_SHAPES also the other kernel of a prompt (`whole`: K walked by each warp, or a chunk a
# block and the combine)
SIM_SHAPES = [(3, 11, 128), (17, 9, 64), (2, 8, 576)]  # the last: two chunks of K, the second short (same steps)
WHOLE_SHAPES = {"sim": [(20, 9, 576)], "gpu": [(512, 2048, 6144), (640, 4096, 2048)]}
GPU_SHAPES = [(1, 6144, 2048), (16, 6144, 2048), (512, 6144, 2048), (1, 2048, 2048), (16, 2048, 2048),
              (512, 2048, 2048), (1, 4096, 2048), (16, 4096, 2048), (1, 512, 2048), (16, 512, 2048), (1, 16, 2048),
              (1, 2048, 6144), (16, 2048, 6144), (512, 2048, 6144), (3, 1000, 1088), (17, 248, 2048), (100, 333, 1024),
              (1, 248320, 2048), (16, 248320, 2048)]


def random_affine(rng, outs, columns, bits, group_size):
    """Random codes, and bf16 scales and biases of a spread like a checkpoint's: (packed, scales, biases)."""
    packed = rng.integers(0, 2 ** 32, (outs, columns * bits // 32), dtype=np.uint64).astype(np.uint32)
    groups = (outs, columns // group_size)
    scales = bf16_to_f32(f32_to_bf16(rng.uniform(0.002, 0.03, groups).astype(np.float32)))
    biases = bf16_to_f32(f32_to_bf16(rng.uniform(-0.2, 0.0, groups).astype(np.float32) * (1 << bits) / 16))
    return packed, scales, biases


def _whole_cases(rng, mode, bits, outs=None, **extra):
    """A prompt's shapes through each of its two kernels (`whole` True and False), `outs` in place of their outputs."""
    return [_case(rng, rows, outs or shape_outs, columns, bits, whole=whole, **extra)
            for rows, shape_outs, columns in WHOLE_SHAPES[mode] for whole in (True, False)]


def _cases(bits, gpu_shapes=GPU_SHAPES):
    def cases(mode, rng):
        shapes = SIM_SHAPES if mode == "sim" else gpu_shapes
        out = [_case(rng, rows, outs, columns, bits) for rows, outs, columns in shapes] + _whole_cases(rng, mode, bits)
        if mode == "sim":  # groups of 32: a step of several groups a lane (round) and of one (prompt)
            out += [_case(rng, rows, outs, columns, bits, 32) for rows, outs, columns in SIM_SHAPES]
        return out
    return cases


def _case(rng, rows, outs, columns, bits, group_size=64, **extra):
    packed, scales, biases = random_affine(rng, outs, columns, bits, group_size)
    x = (rng.normal(size=(rows, columns)) * np.exp(rng.normal(size=(rows, 1)))).astype(np.float32)
    x[1:2] *= 8  # rows of other magnitudes than row 0 (its exponents differ)
    name = f"{rows}x{outs}x{columns}" + ("" if extra.get("whole") is None else f" whole={extra['whole']}")
    return (name, {"x": x, "packed": packed, "scales": scales, "biases": biases, "bits": bits,
                   "group_size": group_size, **extra})


def _launch(x, packed, scales, biases, bits, group_size, fault=None, parts=None, gated=False, whole=None):
    """The two kernels on device copies, with `fault` (if any) planted in x's quantized form between them; y starts
    as NaNs, so that an output left unwritten shows (a fresh array may hold a freed one's values, even the twin's).
    `whole`: the prompt kernel to take (`launch_products`), if not its own choice."""
    rows, columns = x.shape
    words, rows_pad = quantize_shape(rows, bits, group_size, columns)
    quantized = launch_quantize(cuda.to_device(x), bits, group_size, words, rows_pad)
    if fault is not None:
        planted = fault(*(a.copy_to_host() for a in quantized), bits, group_size, words)
        quantized = tuple(cuda.to_device(a) for a in planted)
    y = launch_products(quantized, rows, len(packed), cuda.to_device(packed), cuda.to_device(scales),
                        cuda.to_device(biases), bits, group_size, parts=parts, gated=gated, whole=whole,
                        out=cuda.to_device(np.full(rows * (len(packed) // 2 if gated else len(packed)), np.nan,
                                                   np.float32)))
    return tuple(to_host(p) for p in y) if parts is not None else to_host(y)


def _twin(x, packed, scales, biases, bits, group_size, fault=None, whole=None):
    return gemm_affine(x, packed, scales, biases, bits, group_size)


def _group_dropped(digits, exponents, sums, bits, group_size, words):
    """Group 1 of every row contributes nothing: its digits and S zero."""
    columns = digit_position.py_func(np.arange(group_size, 2 * group_size), bits, words)
    digits[:, :, columns], sums[:, 1] = 0, 0
    return digits, exponents, sums


def _limbs_swapped(digits, exponents, sums, bits, group_size, words):
    return digits[[1, 0, 2]].copy(), exponents, sums


def _exponent_off(digits, exponents, sums, bits, group_size, words):
    exponents[0, 0] += 1
    return digits, exponents, sums


def _exponent_of_another_row(digits, exponents, sums, bits, group_size, words):
    exponents[0] = exponents[1]
    return digits, exponents, sums


def _plant(fault):
    return lambda inputs: {**inputs, "fault": fault}


CONTROLS = {"a column group dropped": _plant(_group_dropped), "two limbs swapped": _plant(_limbs_swapped),
            "an exponent off by one": _plant(_exponent_off), "two rows swapped": swap_rows("x"),
            "a row's fixed point taken from another row": _plant(_exponent_of_another_row)}


def _parts_cases(mode, rng):
    shapes = ([(3, (5, 3, 1, 7), 128)] if mode == "sim" else
              [(1, (6144, 2048, 16, 16), 2048), (16, (6144, 2048, 16, 16), 2048), (512, (6144, 2048, 16, 16), 2048),
               (1, (4096, 512, 512), 2048), (16, (4096, 512, 512), 2048), (512, (4096, 512, 512), 2048)])
    widths = (5, 3, 1, 7) if mode == "sim" else (6144, 2048, 16, 16)
    return ([_case(rng, rows, sum(widths), columns, 4, widths=widths) for rows, widths, columns in shapes] +
            _whole_cases(rng, mode, 4, sum(widths), widths=widths))


def _parts_twin(widths, fault=None, whole=None, **inputs):
    return tuple(np.split(gemm_affine(**inputs), np.cumsum(widths)[:-1], axis=1))


def _parts_launch(widths, **inputs):
    return _launch(**inputs, parts=widths)


def _boundary_moved(inputs):
    widths = inputs["widths"]
    return {**inputs, "widths": (widths[0] + 1, widths[1] - 1) + tuple(widths[2:])}


def _gated_cases(mode, rng):
    shapes = [(3, 10, 128), (18, 8, 64)] if mode == "sim" else [(1, 12288, 2048), (16, 12288, 2048),
                                                                  (512, 12288, 2048), (5, 1000, 1024)]
    return ([_case(rng, rows, outs, columns, 4) for rows, outs, columns in shapes] +
            _whole_cases(rng, mode, 4, 10 if mode == "sim" else 12288))


def _gated_twin(fault=None, whole=None, **inputs):
    return swiglu(gemm_affine(**inputs))


def _gated_launch(**inputs):
    return _launch(**inputs, gated=True)


def _gate_and_up_swapped(inputs):
    half = len(inputs["packed"]) // 2
    return {**inputs, **{name: np.concatenate([inputs[name][half:], inputs[name][:half]])
                         for name in ("packed", "scales", "biases")}}


KERNELS = (gemm_kernel, round_kernel, round_tile, combine_kernel, finish_output, whole_kernel, whole_tile, whole_bases,
           lane_rows, quantize_kernel, fixed_point, digit_position, load_words)
CONTRACT = [
    KernelCheck("gemm_affine4", _twin, _launch, _cases(4), CONTROLS, kernels=KERNELS),
    KernelCheck("gemm_affine8", _twin, _launch, _cases(8, [s for s in GPU_SHAPES if s[1] != 248320 or s[0] == 1]),
                CONTROLS, kernels=KERNELS),
    KernelCheck("gemm_affine4 in parts", _parts_twin, _parts_launch, _parts_cases,
                {**CONTROLS, "a part boundary one output late": _boundary_moved}, kernels=KERNELS + (output_index,)),
    KernelCheck("gemm_affine4 gated (SwiGLU)", _gated_twin, _gated_launch, _gated_cases,
                {**CONTROLS, "gate and up swapped": _gate_and_up_swapped}, kernels=KERNELS),
]
