"""The checks of topk.py: the k best ids of each row and their log-probabilities, over rows with planted ties."""
import numpy as np
from numba import cuda

from tensorfold.contract import KernelCheck
from tensorfold.contract.controls import drop_row, roll, swap_rows, ties_to_the_higher_id
from tensorfold.cuda.topk import THREADS, topk, topk_kernel, topk_launch
from tensorfold.device.grid import to_host


def _plant_ties(rng, logits, k):
    """Per row: the maximum and the k-th best value each copied to a random id and to an id of the same thread (one
    stride away), so that ties decide both the order at the top and which ids make the cut, in the walk and in the
    merges; a few -inf logits (masked tokens) too."""
    for row in logits:
        order = np.lexsort((np.arange(len(row)), -row))
        middle, bottom = order[k + 1:3 * len(row) // 4], order[3 * len(row) // 4:]  # ids outside the k + 1 best
        for original, spare in zip((order[0], order[k - 1]), rng.choice(middle, 2, replace=False)):
            neighbour = original + THREADS if original + THREADS < len(row) else original - THREADS
            row[[i for i in (spare, neighbour) if i in middle]] = row[original]
        row[rng.choice(bottom, 3, replace=False)] = -np.inf
    return logits


def _cases(mode, rng):
    """(rows, V, k): the drafter's rows (1 and 15) at Qwen3.5's vocabulary and a small one, and odd shapes."""
    if mode == "sim":
        shapes = [(2, 300, 5), (2, 130, 32), (2, 200, 1)]
    else:
        shapes = [(rows, vocab, k) for vocab in (248320, 4096) for rows in (1, 15) for k in (1, 8, 16)]
        shapes += [(15, 4096, 32), (5, 1000, 8)]
    cases = []
    for rows, vocab, k in shapes:
        logits = (rng.normal(size=(rows, vocab)) * 3).astype(np.float32)
        cases.append((f"{rows}x{vocab} k{k}", {"logits": _plant_ties(rng, logits, k), "k": k}))
    return cases


def _launch(logits, k):
    return to_host(topk_launch(cuda.to_device(logits), k))


CONTRACT = [
    KernelCheck("topk", twin=topk, launch=_launch, cases=_cases,
                controls={"two swapped rows": swap_rows("logits"), "a dropped row": drop_row("logits"),
                          "an id off by one": roll("logits"),
                          "ties towards the higher id": ties_to_the_higher_id(within=lambda i: i["k"] + 1)},
                kernels=(topk_kernel,)),
]
