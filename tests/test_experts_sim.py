"""The routed experts' grouped GEMM (tensorfold/cuda/experts.py) at tiny shapes (in the simulator without --gpu):
the device grouping equals `expert_pairs`, and a row's result does not depend on the rows that share its experts
(rows alone == rows together == the twin). Each has a planted control: a pair moved to another expert, and a grouped
GEMM that rounds each expert's rows to one fixed point (a scale per group of rows, as a block-scaled GEMM would)."""
import numpy as np
from numba import cuda

from tensorfold.contract.gemm import random_affine
from tensorfold.contract.experts import AffineStack
from tensorfold.cuda.experts import (
    expert_pairs,
    group_launch,
    grouped_gemm,
    grouped_products,
    grouped_shape,
    routed_experts,
    routed_experts_launch,
)
from tensorfold.cuda.quantize import LIMBS, P, digit_position, fixed_point

EXPERTS, HIDDEN, WIDTH, GROUP = 4, 64, 32, 32
# row 0 shares expert 0 with rows 1 and 2 and expert 1 with row 2; row 3 alone takes expert 3
IDS = np.array([[0, 1], [2, 0], [1, 0], [3, 2]], np.int32)


def stacks(rng, bits=4):
    gate_up = AffineStack(*random_affine(rng, EXPERTS * 2 * WIDTH, HIDDEN, bits, GROUP), bits, GROUP)
    down = AffineStack(*random_affine(rng, EXPERTS * HIDDEN, WIDTH, bits, GROUP), bits, GROUP)
    return gate_up, down


def per_expert(stack):
    size = stack.out_features // EXPERTS
    return [stack.rows(e * size, (e + 1) * size) for e in range(EXPERTS)]


def x_rows(rng):
    x = rng.normal(size=(len(IDS), HIDDEN)).astype(np.float32)
    return x * np.float32([[1], [8], [0.05], [300]])  # rows of other magnitudes than row 0's


def grouping_on_device(ids, experts):
    grouping = group_launch(cuda.to_device(ids), experts)
    return grouping.order.copy_to_host(), grouping.offsets.copy_to_host()


def test_the_device_grouping_equals_expert_pairs():
    rng = np.random.default_rng(0)
    for rows, k, experts in [(4, 2, 4), (7, 3, 9), (6, 1, 2)]:
        ids = np.stack([rng.permutation(experts)[:k] for _ in range(rows)]).astype(np.int32)
        order, offsets = grouping_on_device(ids, experts)
        pairs = expert_pairs(ids, experts)
        assert [list(order[offsets[e]:offsets[e + 1]]) for e in range(experts)] == [list(p) for p in pairs]
        moved = ids.copy()
        moved[0, 0] = next(e for e in range(experts) if e not in ids[0])
        order, offsets = grouping_on_device(moved, experts)
        assert [list(order[offsets[e]:offsets[e + 1]]) for e in range(experts)] != [list(p) for p in pairs], \
            "control: a pair moved to another expert"


def run(x, ids, gate_up, down):
    return routed_experts_launch(cuda.to_device(x), cuda.to_device(ids), gate_up.on_device(),
                                 down.on_device()).copy_to_host()


def test_a_row_alone_equals_the_row_among_others():
    rng = np.random.default_rng(1)
    x, (gate_up, down) = x_rows(rng), stacks(rng)
    together = run(x, IDS, gate_up, down)
    twin = routed_experts(x, IDS, per_expert(gate_up), per_expert(down))
    assert together.tobytes() == twin.tobytes()
    for r in (0, 3):  # row 0 shares both its experts with other rows; row 3 has expert 3 to itself
        assert run(x[r:r + 1], IDS[r:r + 1], gate_up, down).tobytes() == together[r:r + 1].tobytes(), f"row {r}"


def quantized_per_group(h, ids, weight, words):
    """h's fixed point with one exponent per expert's rows and column group (the largest over its rows), laid out
    as launch_quantize lays it out: what a grouped GEMM that rounds per group would multiply."""
    pairs, columns = h.shape
    groups = columns // weight.group_size
    grouped = h.reshape(pairs, groups, weight.group_size).astype(np.float64)
    exponents = np.zeros((pairs, groups), np.int32)
    for rows in expert_pairs(ids, EXPERTS):
        if len(rows):
            exponents[rows] = np.frexp(np.abs(grouped[rows]).max(axis=(0, 2)))[1]
    X, d0, d1, d2 = fixed_point.py_func(grouped, np.ldexp(1.0, P - exponents)[:, :, None])
    digits = np.zeros((LIMBS, pairs, columns), np.int8)
    at = digit_position.py_func(np.arange(columns), weight.bits, words)
    for limb, d in enumerate((d0, d1, d2)):
        digits[limb][:, at] = d.reshape(pairs, columns)
    return tuple(cuda.to_device(a) for a in (digits, exponents, X.sum(axis=2).astype(np.int32)))


def test_control_a_grouped_gemm_that_rounds_per_group_is_caught():
    """The down projection with each expert's rows rounded to one fixed point: a shared row's result now follows
    its neighbours, so the rows together differ from the rows alone."""
    rng = np.random.default_rng(1)
    x, (gate_up, down) = x_rows(rng), stacks(rng)

    def rounded_per_group(x, ids):
        pairs = ids.size
        grouping = group_launch(cuda.to_device(ids), EXPERTS)
        h = grouped_gemm(cuda.to_device(x), ids.shape[1], grouping, pairs, gate_up.on_device(), EXPERTS, gated=True)
        words = grouped_shape(pairs, EXPERTS, down, WIDTH)[0]
        quantized = quantized_per_group(h.copy_to_host(), ids, down, words)
        return grouped_products(quantized, 1, grouping, pairs, down.on_device(), EXPERTS).copy_to_host()

    together = rounded_per_group(x, IDS).reshape(len(IDS), 2, HIDDEN)
    alone = np.stack([rounded_per_group(x[r:r + 1], IDS[r:r + 1]).reshape(2, HIDDEN) for r in range(len(IDS))])
    assert together[3, 0].tobytes() == alone[3, 0].tobytes(), "expert 3's lone pair: as before"
    assert together.tobytes() != alone.tobytes()
