"""The checks of experts.py: the grouping of a round's (row, rank) pairs by expert on the device, and the routed
experts' grouped GEMM on the tensor cores (4- and 8-bit).

The routed experts' twin runs each expert's rows together through the exact GEMM's twin (rows sorted by expert);
the kernels sort the pairs on the device and run the grouped GEMM. The controls plant what a grouped GEMM can get
wrong: a row sent to the wrong expert, two experts' weights swapped (two routed ones, and the shared one with a
routed one where the shared expert is folded in), rows swapped; and in the grouping, a pair counted in the wrong
expert and pairs in the wrong order."""
import dataclasses

import numpy as np
from numba import cuda

from tensorfold.contract import KernelCheck
from tensorfold.contract.controls import swap_rows
from tensorfold.contract.gemm import random_affine
from tensorfold.cuda.experts import (
    expert_pairs,
    with_shared,
    group_kernel,
    group_launch,
    grouped_kernel,
    grouped_round_kernel,
    grouped_whole_kernel,
    clear_tiles,
    tile_kernel,
    tile_pairs,
    write_tile,
    routed_experts,
    routed_experts_launch,
    row_tiles,
)
from tensorfold.cuda.gemm import combine_kernel, round_tile, tile_products, whole_tile
from tensorfold.cuda.gemm_launch import row_halves_for
from tensorfold.cuda.quantize import quantize_kernel
from tensorfold.device.grid import to_host

# (rows, experts, k, hidden, expert width, shared: the last expert is the shared one, folded in, every row's rank k,
# whole: the kernels to take, `grouped_products`, None for their own choice): under the simulator a few rows (the
# first: 6 pairs on 4 experts, one expert holding two; the second: K of two chunks, its gate/up in the round kernel);
# on the GPU Qwen3.5-35B-A3B's experts at a decode round's rows, and at prompt chunks' (the last of each: more than 16
# rows an expert on average, the prompt kernel's shape)
EXPERTS_SIM = [(3, 4, 2, 64, 64, False, None), (2, 4, 2, 576, 64, True, None), (26, 3, 2, 64, 64, False, None),
               (26, 3, 2, 64, 64, False, False)]
EXPERTS_GPU = [(1, 256, 8, 2048, 512, False, None), (16, 256, 8, 2048, 512, False, None),
               (128, 256, 8, 2048, 512, False, None), (512, 256, 8, 2048, 512, False, None),
               (1, 257, 8, 2048, 512, True, None), (16, 257, 8, 2048, 512, True, None),
               (2048, 257, 8, 2048, 512, True, None), (2048, 257, 8, 2048, 512, True, False)]
# (rows, k, experts, shared) of the grouping: under the simulator experts left unused and an expert taken by half
# the rows (in the last, more than one row tile of 32 pairs); with `shared`, the last expert is the shared one, which
# no row routes to and every row takes
GROUPS_SIM = [(5, 2, 4, False), (3, 3, 8, False), (9, 1, 2, False), (4, 2, 5, True), (40, 2, 3, False)]
GROUPS_GPU = [(1, 8, 256, False), (16, 8, 256, False), (512, 8, 256, False), (7, 10, 512, False), (16, 8, 257, True),
              (2048, 8, 257, True)]  # the last: a 2,048-row prompt chunk of the 35B-A3B


def _groups_cases(mode, rng):
    out = []
    for rows, k, experts, shared in GROUPS_SIM if mode == "sim" else GROUPS_GPU:
        routed = experts - shared
        ids = np.stack([rng.permutation(routed)[:k] for _ in range(rows)]).astype(np.int32)
        ids[:rows // 2, 0] = 0  # one expert taken by half the rows
        out.append((f"{rows} rows top {k} of {routed} experts" + (" and the shared one" if shared else ""),
                    {"ids": ids, "experts": experts, "shared": shared}))
    return out


def groups_twin(ids, experts, shared):
    """`expert_pairs` as the kernels write it: the pairs in one list, where each expert's start, and the table of the
    row tiles they fill (each tile's expert and pairs, -1 past its expert's last pair and past the last tile)."""
    pairs = expert_pairs(with_shared(ids, experts, shared), experts)
    offsets = np.cumsum([0] + [len(p) for p in pairs]).astype(np.int32)
    count = len(ids) * (ids.shape[1] + shared)
    tile_rows = 8 * row_halves_for(-(-count // experts))
    table = np.full((row_tiles(count, experts, tile_rows), 1 + tile_rows), -1, np.int32)
    tiles = [(e, pairs[e][first:first + tile_rows]) for e in range(experts) for first in range(0, len(pairs[e]),
                                                                                               tile_rows)]
    for tile, (e, its_pairs) in enumerate(tiles):
        table[tile, 0], table[tile, 1:1 + len(its_pairs)] = e, its_pairs
    return np.concatenate(pairs).astype(np.int32), offsets, table


def _groups_launch(ids, experts, shared):
    grouping = group_launch(cuda.to_device(ids), experts, shared)
    return to_host((grouping.order, grouping.offsets, grouping.table))


def _pair_to_another_expert(inputs):
    ids = inputs["ids"].copy()
    spare = [e for e in range(inputs["experts"] - inputs["shared"]) if e not in ids[0]]
    ids[0, -1] = spare[0]
    return {**inputs, "ids": ids}


@dataclasses.dataclass
class AffineStack:
    """An affine weight as the kernels take it (the fields of a checkpoint Linear that they read)."""
    data: np.ndarray
    scales: np.ndarray
    biases: np.ndarray
    bits: int
    group_size: int
    kind: str = "affine"

    @property
    def out_features(self) -> int:
        return len(self.data)

    @property
    def in_features(self) -> int:
        return self.scales.shape[1] * self.group_size

    def rows(self, start, stop):
        return AffineStack(self.data[start:stop], self.scales[start:stop], self.biases[start:stop], self.bits,
                           self.group_size)

    def on_device(self):
        return AffineStack(cuda.to_device(self.data), cuda.to_device(self.scales), cuda.to_device(self.biases),
                           self.bits, self.group_size)


def _experts_cases(bits):
    def cases(mode, rng):
        out = []
        for rows, experts, k, hidden, width, shared, whole in EXPERTS_SIM if mode == "sim" else EXPERTS_GPU:
            if mode == "sim" and bits == 8 and (shared or rows > 16):  # the simulator's slowest checks, the fold and
                continue  # the prompt's shape, in one of the two
            for group_size in ((64,) if bits == 4 else (32,)) if mode == "sim" else (64,):
                gate_up = AffineStack(*random_affine(rng, experts * 2 * width, hidden, bits, group_size), bits,
                                      group_size)
                down = AffineStack(*random_affine(rng, experts * hidden, width, bits, group_size), bits, group_size)
                x = (rng.normal(size=(rows, hidden)) * np.exp(rng.normal(size=(rows, 1)))).astype(np.float32)
                ids = np.stack([rng.permutation(experts - shared)[:k] for _ in range(rows)]).astype(np.int32)
                ids[0, :2] = (0, 1)  # experts 0 and 1 in use, expert 0 by two rows where there are two
                if rows > 1:
                    ids[1, 0] = 0
                out.append((f"{rows} rows, {experts} experts top {k}" + (" (the last shared)" if shared else "") +
                            f", {hidden}x{width}, groups of {group_size}" +
                            ("" if whole is None else f", whole={whole}"),
                            {"x": x, "ids": ids, "gate_up": gate_up, "down": down, "shared": shared, "whole": whole}))
        return out
    return cases


def _per_expert(stack, experts):
    size = stack.out_features // experts
    return [stack.rows(e * size, (e + 1) * size) for e in range(experts)]


def _experts_twin(x, ids, gate_up, down, shared, whole):
    experts = down.out_features // x.shape[1]
    return routed_experts(x, ids, _per_expert(gate_up, experts), _per_expert(down, experts), shared=shared)


def _experts_launch(x, ids, gate_up, down, shared, whole):
    return to_host(routed_experts_launch(cuda.to_device(x), cuda.to_device(ids), gate_up.on_device(),
                                         down.on_device(), shared, whole=whole))


def _row_to_the_wrong_expert(inputs):
    ids = inputs["ids"].copy()
    experts = inputs["down"].out_features // inputs["x"].shape[1] - inputs["shared"]
    spare = [e for e in range(experts) if e not in ids[0]]
    ids[0, 0] = spare[0]
    return {**inputs, "ids": ids}


def _experts_swapped(first, second):
    """Experts `first` and `second` (negative: from the last) trade their gate/up and down weights."""
    def control(inputs):
        experts = inputs["down"].out_features // inputs["x"].shape[1]
        a, b = first % experts, second % experts
        swapped = {}
        for name in ("gate_up", "down"):
            stack = inputs[name]
            size = stack.out_features // experts
            order = np.arange(stack.out_features).reshape(experts, size)
            order[[a, b]] = order[[b, a]]
            order = order.reshape(-1)
            swapped[name] = AffineStack(stack.data[order], stack.scales[order], stack.biases[order], stack.bits,
                                        stack.group_size)
        return {**inputs, **swapped}
    return control


EXPERT_KERNELS = (group_kernel, tile_kernel, write_tile, clear_tiles, grouped_kernel, grouped_round_kernel,
                  grouped_whole_kernel, tile_pairs, tile_products, round_tile, whole_tile, quantize_kernel,
                  combine_kernel)
EXPERT_CONTROLS = {"a row routed to the wrong expert": _row_to_the_wrong_expert,
                   "two experts' weights swapped": _experts_swapped(0, 1),
                   "the first and the last expert's weights swapped": _experts_swapped(0, -1),
                   "two rows swapped": swap_rows("x")}
CONTRACT = [
    KernelCheck("moe_expert_groups", groups_twin, _groups_launch, _groups_cases,
                {"a pair counted in another expert": _pair_to_another_expert, "two rows swapped": swap_rows("ids")},
                kernels=(group_kernel, tile_kernel)),
    KernelCheck("moe_routed_experts4", _experts_twin, _experts_launch, _experts_cases(4), EXPERT_CONTROLS,
                kernels=EXPERT_KERNELS),
    KernelCheck("moe_routed_experts8", _experts_twin, _experts_launch, _experts_cases(8), EXPERT_CONTROLS,
                kernels=EXPERT_KERNELS),
]
