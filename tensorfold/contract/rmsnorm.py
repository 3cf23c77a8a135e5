"""The checks of rmsnorm.py: the plain, residual and gated norms, whole rows and per head, and each again with its
output quantized for a GEMM in the same launch (against the norm's twin, then quantize.py's laid out)."""
import numpy as np
from numba import cuda

from tensorfold.contract import KernelCheck
from tensorfold.contract.controls import swap_rows, times
from tensorfold.contract.quantize import as_bytes, laid_out
from tensorfold.cuda.gemm_launch import quantize_shape
from tensorfold.cuda.quantize import quantize_columns
from tensorfold.cuda.rmsnorm import (
    add_rmsnorm,
    add_rmsnorm_digits_kernel,
    add_rmsnorm_kernel,
    add_rmsnorm_launch,
    quantize_steps,
    quantize_vector,
    rmsnorm,
    rmsnorm_digits_kernel,
    rmsnorm_gated,
    rmsnorm_gated_digits_kernel,
    rmsnorm_gated_kernel,
    rmsnorm_gated_launch,
    rmsnorm_kernel,
    rmsnorm_launch,
)
from tensorfold.device.grid import to_host


def _cases(mode, rng):
    """(rows, vectors per row, width): whole rows of D, and the per-head norms (q/k norms, DeltaNet heads); a row
    longer than one batch a thread (THREADS * LOADS: the 4B's 2,560 on GPU) takes add_rmsnorm's other path."""
    shapes = [(3, 1, 40), (2, 3, 130), (2, 1, 2100)] if mode == "sim" else [
        (1, 1, 1024), (16, 1, 2048), (128, 1, 1024), (16, 8, 256), (5, 16, 128), (3, 1, 1000), (4, 1, 2560)]
    cases = []
    for rows, vectors, width in shapes:
        x = rng.normal(size=(rows, vectors, width)).astype(np.float32)
        z = rng.normal(size=(rows, vectors, width)).astype(np.float32)
        cases.append((f"{rows}x{vectors}x{width}", {"x": x, "z": z, "multiplier": (1 + rng.normal(size=width) * 0.3)
                                                    .astype(np.float32), "eps": 1e-6}))
    return cases


def _digit_cases(heads_too):
    """(rows, heads, width, bits of each layout, group size): a round's rows and a prompt chunk's (past 16 rows,
    padded), 4- and 8-bit layouts and both at once (an MoE router's and its experts'), and for the gated norm heads of
    whole groups; on the GPU the 2B's and 35B-A3B's widths."""
    def cases(mode, rng):
        shapes = [(3, 1, 128, (4,), 64), (17, 1, 64, (8,), 32), (1, 1, 2112, (4,), 64), (2, 3, 64, (4,), 32),
                  (3, 1, 128, (8, 4), 32)] if mode == "sim" \
            else [(1, 1, 2048, (4,), 64), (16, 1, 2048, (4,), 64), (16, 1, 2048, (8,), 64), (5, 1, 2048, (4,), 64),
                  (300, 1, 2048, (4,), 64), (3, 1, 2560, (4,), 64), (1, 16, 128, (4,), 64), (16, 32, 128, (4,), 64),
                  (300, 16, 128, (4,), 64), (1, 1, 2048, (8, 4), 64), (16, 1, 2048, (8, 4), 64)]
        out = []
        for rows, heads, width, bits, group_size in shapes:
            if heads > 1 and not heads_too:
                continue
            x = (rng.normal(size=(rows, heads, width)) * np.exp(rng.normal(size=(rows, heads, 1)))).astype(np.float32)
            out.append((f"{rows}x{heads}x{width} {'+'.join(map(str, bits))}-bit/{group_size}",
                        {"x": x, "z": rng.normal(size=x.shape).astype(np.float32),
                         "multiplier": (1 + rng.normal(size=width) * 0.3).astype(np.float32), "eps": 1e-6,
                         "bits": bits, "group_size": group_size}))
        return out
    return cases


def _with_digits(norm):
    """The twin of a norm that quantizes its output: the norm's twin (its outputs), then y's rows laid out for a
    GEMM of them, in each layout."""
    def twin(x, z, multiplier, eps, bits, group_size):
        outputs = norm(x, z, multiplier, eps)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        y = outputs[-1].reshape(len(x), -1)
        return (*outputs, *(part for each in bits for part in laid_out(y, each, group_size)))
    return twin


def _digits_launch(launch):
    """A norm's launch told the layouts of GEMMs of its rows: its outputs, then the digits it left on y in each."""
    def run(x, z, multiplier, eps, bits, group_size):
        shapes = [quantize_shape(len(x), each, group_size, x.shape[1] * x.shape[2]) for each in bits]
        steps = tuple((each, words) for each, (words, _) in zip(bits, shapes))
        outputs = launch(x, z, multiplier, eps, (steps, group_size, shapes[0][1]))
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        digits = [as_bytes(*(to_host(a) for a in outputs[-1].gemm_digits[each, group_size, words]))
                  for each, words in steps]
        return (*(to_host(a) for a in outputs), *(part for each in digits for part in each))
    return run


def _told(name, value):
    """The kernel told another `name` than the twin (its code width, its group size): digits laid out for another
    GEMM, or groups of the wrong width."""
    return lambda inputs: {**inputs, name: value(inputs[name])}


def _rows(a):
    """A case's [rows, 1, width] as the [rows, width] on the device that the plain and residual norms take."""
    return cuda.to_device(a.reshape(len(a), -1))


_CONTROLS = {"two swapped rows": swap_rows("x"), "eps off by a factor of ten": times("eps", 10)}
CONTRACT = [
    KernelCheck("rmsnorm", lambda x, z, multiplier, eps: rmsnorm(x, multiplier, eps),
                lambda x, z, multiplier, eps: to_host(rmsnorm_launch(
                    cuda.to_device(x), cuda.to_device(multiplier), eps)),
                _cases, _CONTROLS, kernels=(rmsnorm_kernel,)),
    KernelCheck("add_rmsnorm", lambda x, z, multiplier, eps: add_rmsnorm(x, z, multiplier, eps),
                lambda x, z, multiplier, eps: to_host(add_rmsnorm_launch(
                    cuda.to_device(x), cuda.to_device(z), cuda.to_device(multiplier), eps)),
                _cases, {**_CONTROLS, "the sum of another row": swap_rows("z")}, kernels=(add_rmsnorm_kernel,)),
    KernelCheck("rmsnorm_gated", rmsnorm_gated,
                lambda x, z, multiplier, eps: to_host(rmsnorm_gated_launch(
                    cuda.to_device(x), cuda.to_device(z), cuda.to_device(multiplier), eps)),
                _cases, {**_CONTROLS, "gate of another row": swap_rows("z")}, kernels=(rmsnorm_gated_kernel,)),
    *(KernelCheck(name + " with digits", _with_digits(twin), _digits_launch(launch),
                  _digit_cases(heads_too=factory is rmsnorm_gated_digits_kernel),
                  {"two swapped rows": swap_rows("x"), "eps off by a factor of ten": times("eps", 10),
                   "the other code width": _told("bits", lambda bits: tuple(12 - each for each in bits)),
                   "groups half as wide": _told("group_size", lambda size: size // 2)},
                  kernels=(factory, quantize_steps, quantize_vector, quantize_columns))
      for name, twin, launch, factory in (
          ("rmsnorm", lambda x, z, multiplier, eps: rmsnorm(x, multiplier, eps),
           lambda x, z, multiplier, eps, layout: rmsnorm_launch(_rows(x), cuda.to_device(multiplier), eps,
                                                                layout=layout), rmsnorm_digits_kernel),
          ("add_rmsnorm", lambda x, z, multiplier, eps: add_rmsnorm(x, z, multiplier, eps),
           lambda x, z, multiplier, eps, layout: add_rmsnorm_launch(_rows(x), _rows(z), cuda.to_device(multiplier),
                                                                    eps, layout=layout), add_rmsnorm_digits_kernel),
          ("rmsnorm_gated", rmsnorm_gated,
           lambda x, z, multiplier, eps, layout: rmsnorm_gated_launch(
               cuda.to_device(x), cuda.to_device(z), cuda.to_device(multiplier), eps, layout=layout),
           rmsnorm_gated_digits_kernel))),
]
