"""The checks of sampling.py: a seeded filtered draw for each row, rows at temperature 0 among them."""
import numpy as np
from numba import cuda

from tensorfold.contract import KernelCheck
from tensorfold.contract.argmax import plant_tied_maxima
from tensorfold.contract.controls import off_by, swap_rows
from tensorfold.cuda.argmax import argmax_part_kernel
from tensorfold.cuda.sampling import sample_kernel, sample_launch, sample_rows
from tensorfold.device.grid import to_host

# (temperature, top_k, top_p, min_p) per row; rows cycle through them
_SIM_PARAMS = [[(0.8, 40, 0.9, 0.01), (1.3, 0, 0.6, 0.0)],
               [(0.0, 0, 1.0, 0.0), (0.5, 3, 1.0, 0.2)]]
_GPU_PARAMS = [(0.0, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0), (0.7, 50, 0.9, 0.0), (1.0, 0, 0.8, 0.05), (1.5, 20, 1.0, 0.0),
               (0.6, 0, 0.95, 0.1), (1.0, 1, 1.0, 0.0), (0.9, 1000, 0.5, 0.0)]


def _sample_inputs(rng, rows, vocab, params):
    logits = (rng.normal(size=(rows, vocab)) * 1.5).astype(np.float32)
    plant_tied_maxima(rng, logits[:1])
    table = np.array([params[r % len(params)] for r in range(rows)], np.float64)
    return {"logits": logits, "seeds": rng.integers(0, 1 << 63, rows, dtype=np.uint64),
            "positions": rng.integers(0, 5000, rows).astype(np.uint64), "temperature": table[:, 0].astype(np.float32),
            "top_k": table[:, 1].astype(np.int32), "top_p": table[:, 2].astype(np.float32),
            "min_p": table[:, 3].astype(np.float32)}


def _sample_cases(mode, rng):
    if mode == "sim":
        return [("2x400", _sample_inputs(rng, 2, 400, _SIM_PARAMS[0])),
                ("2x300", _sample_inputs(rng, 2, 300, _SIM_PARAMS[1]))]
    return [(f"{rows}x{vocab}", _sample_inputs(rng, rows, vocab, _GPU_PARAMS))
            for rows, vocab in [(1, 248320), (16, 248320), (16, 4096), (1, 4096), (5, 1000)]]


def _launch_sample(**inputs):
    return to_host(sample_launch(*(cuda.to_device(np.ascontiguousarray(inputs[name])) for name in (
        "logits", "seeds", "positions", "temperature", "top_k", "top_p", "min_p"))))


def _top_p_ignored(inputs):
    """Planted: every row drawn without its top-p filter (None where no row has one)."""
    if (inputs["top_p"] >= 1).all():
        return None
    return {**inputs, "top_p": np.ones_like(inputs["top_p"])}


CONTRACT = [
    KernelCheck("sample", twin=sample_rows, launch=_launch_sample, cases=_sample_cases,
                controls={"position off by one": off_by("positions", np.uint64(1)),
                          "two swapped rows": swap_rows("logits"), "top_p ignored": _top_p_ignored},
                kernels=(argmax_part_kernel, sample_kernel)),
]
