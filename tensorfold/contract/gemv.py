"""The checks of gemv.py: x laid out in walk order, and the GEMV of both float formats, in parts and gated."""
import numpy as np
from numba import cuda

from tensorfold.contract import KernelCheck
from tensorfold.contract.controls import drop_row, roll, swap_rows
from tensorfold.cuda.elementwise import silu_mul_kernel
from tensorfold.cuda.gemv import (
    gemv_bf16,
    gemv_bf16_kernel,
    gemv_f32,
    gemv_f32_kernel,
    gemv_kernel,
    launch_gemv,
    launch_walk_x,
    output_index,
    slot_output,
    swiglu,
    walk_x,
    walk_x_kernel,
)
from tensorfold.cuda.weights import CHUNK, bf16_format, f32_format
from tensorfold.device.grid import to_host
from tensorfold.numerics.formats import f32_to_bf16


def _walk_cases(mode, rng):
    """x of a round's rows in tiles: a last round cut short, a chunk cut short, one short round, a last tile of
    fewer rows; on GPU 2B's widths in each tile of TILES."""
    shapes = ([(1, 200, 1), (3, 1280, 4), (2, 5, 8), (17, 130, 8)] if mode == "sim" else
              [(1, 2048, 1), (4, 2048, 4), (16, 6144, 8), (17, 1030, 8), (128, 1024, 8)])
    return [(f"{rows}x{columns} in tiles of {tile}", {"x": rng.normal(size=(rows, columns)).astype(np.float32),
                                                      "tile": tile})
            for rows, columns, tile in shapes]


def _launch_walk(x, tile):
    return to_host(launch_walk_x(cuda.to_device(x), tile))


def _cases(mode, rng):
    """(rows, outputs, columns): tiny under the simulator (a last chunk cut short, walks of several steps, one row
    of 4-bit codes past its interior steps); on GPU the projections of Qwen3.5-0.8B and 2B at 1 and 16 rows, a
    prompt chunk of 128 rows, odd sizes, and the 2B's head last (the controls stop at the first case that catches
    them)."""
    if mode == "sim":
        shapes = [(1, 3, 200), (3, 2, 128), (17, 2, 130), (2, 5, 1280), (1, 9, 1280)]
    else:
        shapes = [(1, 6144, 1024), (16, 3584, 1024), (128, 1024, 3584), (1, 6144, 2048), (16, 6144, 2048),
                  (1, 2048, 6144), (16, 2048, 6144), (3, 1000, 1088), (17, 248, 2048), (2, 333, 1030),
                  (1, 248320, 2048)]
    return [(f"{rows}x{outs}x{cols}", {"x": rng.standard_normal((rows, cols), np.float32),
                                         "weight": rng.standard_normal((outs, cols), np.float32)})
            for rows, outs, cols in shapes]


def _bf16_cases(mode, rng):
    return [(label, {"x": i["x"], "weight_bits": f32_to_bf16(i["weight"])}) for label, i in _cases(mode, rng)]


def _launch_f32(x, weight):
    return to_host(launch_gemv(gemv_f32_kernel, cuda.to_device(x), weight.shape[0], cuda.to_device(weight)))


def _launch_bf16(x, weight_bits):
    return to_host(launch_gemv(gemv_bf16_kernel, cuda.to_device(x), weight_bits.shape[0], cuda.to_device(weight_bits)))


def _chunks_swapped(weight):
    """Planted: chunks 0 and 1 swapped, in x and in the weight `weight` alike, as a walk that took the chunks in
    another order would read them: the exact sum stays, only the order of the additions moves."""
    def plant(inputs):
        x = inputs["x"]
        if x.shape[1] < 2 * CHUNK:
            return None
        stored = inputs[weight].shape[1] * CHUNK // x.shape[1]  # a chunk's entries: columns, or words of codes
        swap = lambda a, n: a[:, np.r_[n:2 * n, 0:n, 2 * n:a.shape[1]]]
        return {**inputs, "x": swap(x, CHUNK), weight: swap(inputs[weight], stored)}
    return plant


def _parts_cases(mode, rng):
    """Outputs cut into parts (the stacked projections): every row count's kernel, parts of odd widths."""
    shapes = ([(3, (5, 3, 1, 7), 128), (1, (4, 12), 1280), (9, (8, 8), 128)] if mode == "sim" else
              [(1, (6144, 2048, 16, 16), 2048), (16, (6144, 2048, 16, 16), 2048), (4, (6144, 6144), 2048),
               (128, (4096, 512, 512), 1024)])
    return [(f"{rows}x{'+'.join(map(str, widths))}x{cols}", {
        "x": rng.normal(size=(rows, cols)).astype(np.float32),
        "weight": rng.normal(size=(sum(widths), cols)).astype(np.float32), "widths": widths})
        for rows, widths, cols in shapes]


def _parts_twin(x, weight, widths):
    return tuple(np.split(gemv_f32(x, weight), np.cumsum(widths)[:-1], axis=1))


def _parts_launch(x, weight, widths):
    return tuple(to_host(p) for p in launch_gemv(gemv_f32_kernel, cuda.to_device(x), weight.shape[0],
                                                 cuda.to_device(weight), parts=widths))


def _boundary_moved(inputs):
    """Planted: the first part cut one output late."""
    widths = inputs["widths"]
    return {**inputs, "widths": (widths[0] + 1, widths[1] - 1) + tuple(widths[2:])}


def _gated_cases(mode, rng):
    """The float32 cases cut to an even count of outputs (a gate for every up): one row, tiles, the head; in the
    simulator also one of more than GATED_ROWS rows (the GEMV, then the product)."""
    cases = [(label, {**inputs, "weight": inputs["weight"][:len(inputs["weight"]) // 2 * 2]})
             for label, inputs in _cases(mode, rng) if len(inputs["weight"]) >= 2]
    if mode == "sim":
        cases.append(("6x4x128", {"x": rng.normal(size=(6, 128)).astype(np.float32),
                                  "weight": rng.normal(size=(4, 128)).astype(np.float32)}))
    return cases


def _launch_gated(x, weight):
    return to_host(launch_gemv(gemv_f32_kernel, cuda.to_device(x), weight.shape[0], cuda.to_device(weight),
                               gated=True))


def _halves(plant):
    """A control that moves the up rows against the gate rows."""
    return lambda inputs: {**inputs, "weight": plant(inputs["weight"], len(inputs["weight"]) // 2)}


_ROW_CONTROLS = {"two swapped rows": swap_rows("x"), "a dropped row": drop_row("x")}
_GATED_CONTROLS = {**_ROW_CONTROLS,
                   "gate and up swapped": _halves(lambda a, half: np.concatenate([a[half:], a[:half]])),
                   "each up one row late": _halves(lambda a, half: np.concatenate([a[:half], np.roll(a[half:], 1, 0)]))}
CONTRACT = [
    KernelCheck("walk_x", walk_x, _launch_walk, _walk_cases, {**_ROW_CONTROLS, "columns shifted by one": roll("x")},
                kernels=(walk_x_kernel,)),
    KernelCheck("gemv_f32", gemv_f32, _launch_f32, _cases,
                {**_ROW_CONTROLS, "chunks 0 and 1 swapped": _chunks_swapped("weight")},
                kernels=(gemv_kernel, f32_format)),
    KernelCheck("gemv_bf16", gemv_bf16, _launch_bf16, _bf16_cases,
                {**_ROW_CONTROLS, "chunks 0 and 1 swapped": _chunks_swapped("weight_bits")},
                kernels=(gemv_kernel, bf16_format)),
    KernelCheck("gemv_f32 in parts", _parts_twin, _parts_launch, _parts_cases,
                {**_ROW_CONTROLS, "a part boundary one output late": _boundary_moved},
                kernels=(gemv_kernel, f32_format, output_index)),
    KernelCheck("gemv_f32 gated (SwiGLU)", lambda **i: swiglu(gemv_f32(**i)), _launch_gated, _gated_cases,
                _GATED_CONTROLS, kernels=(gemv_kernel, f32_format, slot_output, silu_mul_kernel)),
]
