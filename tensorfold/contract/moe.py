"""The checks of moe.py: the router and the weighted sum (the routed experts between them: experts.py's checks).
The controls plant two rows swapped, a row's top expert trading logits with its neighbour, the ranks' weights
swapped, and the shared expert's gate left out."""
import numpy as np
from numba import cuda

from tensorfold.contract import KernelCheck
from tensorfold.contract.controls import swap_rows
from tensorfold.contract.experts import groups_twin
from tensorfold.cuda.experts import group_in_block
from tensorfold.cuda.moe import (combine, combine_kernel, combine_launch, route, route_group_kernel, route_group_launch,
                                 route_kernel, route_launch, route_row)
from tensorfold.device.grid import to_host

# (rows, experts, k): under the simulator a few rows; on the GPU Qwen3.5-35B-A3B's router (256 experts, top 8) at
# a decode round's rows and a prompt chunk's, and the 397B's (512, top 10)
ROUTE_SIM = [(5, 8, 2), (3, 6, 3), (2, 70, 4)]  # the last: lanes of the router's warp hold several experts
ROUTE_GPU = [(1, 256, 8), (16, 256, 8), (512, 256, 8), (7, 512, 10)]


def _route_cases(mode, rng):
    out = []
    for rows, experts, k in ROUTE_SIM if mode == "sim" else ROUTE_GPU:
        logits = rng.normal(0, 2, (rows, experts)).astype(np.float32)
        tied = [j for j in (1, 3, 33) if j < experts]  # 1 and 33 share a lane of the router's warp, 3 does not
        logits[0, tied] = logits[0].max() + 1  # a tie at the top: the lower expert ranks first
        out.append((f"{rows}x{experts} top {k}", {"logits": logits, "k": k}))
    return out


def _route_launch(logits, k):
    return to_host(route_launch(cuda.to_device(logits), k))


# (rows, routed experts, k, shared: a last expert every row takes) of the router with the grouping: under the
# simulator a few rows, with and without the shared expert, and more rows than one block routes (the three launches);
# on the GPU the 35B-A3B's decode rounds, the 397B's router, and a round past one block
GROUP_SIM = [(1, 8, 2, True), (3, 6, 3, False), (2, 70, 4, True), (17, 6, 2, True)]
GROUP_GPU = [(1, 256, 8, True), (16, 256, 8, True), (16, 256, 8, False), (7, 512, 10, False), (17, 256, 8, True)]


def _route_group_cases(mode, rng):
    out = []
    for rows, experts, k, shared in GROUP_SIM if mode == "sim" else GROUP_GPU:
        logits = rng.normal(0, 2, (rows, experts)).astype(np.float32)
        logits[rows // 2:, 0] = logits.max() + 1  # expert 0 taken by half the rows: an expert with several pairs
        out.append((f"{rows}x{experts} top {k}" + (" and the shared expert" if shared else ""),
                    {"logits": logits, "k": k, "shared": shared}))
    return out


def _route_group_twin(logits, k, shared):
    ids, weights = route(logits, k)
    return (ids, weights) + groups_twin(ids, logits.shape[1] + shared, shared)


def _route_group_launch(logits, k, shared):
    ids, weights, grouping = route_group_launch(cuda.to_device(logits), k, logits.shape[1] + shared, shared)
    return to_host((ids, weights, grouping.order, grouping.offsets, grouping.table))


def _top_experts_swapped(inputs):
    """Each row's best expert and its neighbour trade logits: the choice must follow."""
    logits = inputs["logits"].copy()
    best = logits.argmax(axis=1)
    other = (best + 1) % logits.shape[1]
    rows = np.arange(len(logits))
    logits[rows, best], logits[rows, other] = inputs["logits"][rows, other], inputs["logits"][rows, best]
    return {**inputs, "logits": logits}


def _combine_cases(mode, rng):
    """(rows, k, hidden, the shared expert folded in as rank k)"""
    shapes = [(5, 2, 64, False), (3, 3, 40, True)] if mode == "sim" else [
        (1, 8, 2048, False), (16, 8, 2048, False), (512, 8, 2048, False), (1, 8, 2048, True), (512, 8, 2048, True)]
    out = []
    for rows, k, hidden, folded in shapes:
        weights = rng.dirichlet(np.ones(k), rows).astype(np.float32)
        out.append((f"{rows}x{k}x{hidden}{', shared folded in' if folded else ''}", {
            "routed": rng.normal(size=(rows, k + folded, hidden)).astype(np.float32), "weights": weights,
            "shared": None if folded else rng.normal(size=(rows, hidden)).astype(np.float32),
            "gate_logit": rng.normal(0, 2, (rows, 1)).astype(np.float32)}))
    return out


def _combine_launch(routed, weights, shared, gate_logit):
    shared = None if shared is None else cuda.to_device(shared)
    return to_host(combine_launch(cuda.to_device(routed), cuda.to_device(weights), shared, cuda.to_device(gate_logit)))


def _shared_rows_swapped(inputs):
    """Rows 0 and 1 of the shared expert's output swapped: its own array's, or routed's rank k where folded in (None
    with one row)."""
    if inputs["shared"] is not None:
        return swap_rows("shared")(inputs)
    if len(inputs["routed"]) < 2:
        return None
    routed, k = inputs["routed"].copy(), inputs["weights"].shape[1]
    routed[[0, 1], k] = routed[[1, 0], k]
    return {**inputs, "routed": routed}


def _gate_left_out(inputs):
    """sigmoid(60) rounds to 1: the shared expert added ungated."""
    return {**inputs, "gate_logit": np.full_like(inputs["gate_logit"], 60.0)}


def _ranks_swapped(inputs):
    return {**inputs, "weights": inputs["weights"][:, ::-1].copy()}


CONTRACT = [
    KernelCheck("moe_route", route, _route_launch, _route_cases,
                {"two rows swapped": swap_rows("logits"), "the top expert's logit swapped with its neighbour's":
                 _top_experts_swapped}, kernels=(route_kernel, route_row)),
    KernelCheck("moe_route_group", _route_group_twin, _route_group_launch, _route_group_cases,
                {"two rows swapped": swap_rows("logits"), "the top expert's logit swapped with its neighbour's":
                 _top_experts_swapped}, kernels=(route_group_kernel, route_row, group_in_block)),
    KernelCheck("moe_combine", combine, _combine_launch, _combine_cases,
                {"the shared expert's gate left out": _gate_left_out, "the ranks' weights swapped": _ranks_swapped,
                 "the shared expert's rows swapped": _shared_rows_swapped}, kernels=(combine_kernel,)),
]
