"""The checks of argmax.py: each row's argmax, over rows whose maximum is tied across threads."""
import numpy as np
from numba import cuda

from tensorfold.contract import KernelCheck
from tensorfold.contract.controls import roll, swap_rows, ties_to_the_higher_id
from tensorfold.cuda.argmax import THREADS, argmax, argmax_kernel, argmax_launch, argmax_part_kernel
from tensorfold.device.grid import to_host


def plant_tied_maxima(rng, logits):
    """Copy each row's maximum to two more ids, one of them lower than the original and owned by a later thread."""
    for row in logits:
        top = int(np.argmax(row))
        low = int(rng.integers(0, max(1, min(top, THREADS))))  # a lower id (or 0)
        high = int(rng.integers(low, len(row)))
        row[[low, high]] = row[top]
    return logits


def _cases(mode, rng):
    shapes = [(2, 300), (3, 517), (1, 4500)] if mode == "sim" else [(1, 248320), (16, 248320), (16, 4096), (5, 1000)]
    cases = []
    for rows, vocab in shapes:
        logits = rng.normal(size=(rows, vocab)).astype(np.float32)
        cases.append((f"{rows}x{vocab}", {"logits": plant_tied_maxima(rng, logits)}))
    return cases


def _launch(logits):
    return to_host(argmax_launch(cuda.to_device(logits)))


CONTRACT = [
    KernelCheck("argmax", twin=argmax, launch=_launch, cases=_cases,
                controls={"two swapped rows": swap_rows("logits"),
                          "ties towards the higher id": ties_to_the_higher_id(), "an id off by one": roll("logits")},
                kernels=(argmax_part_kernel, argmax_kernel)),
]
