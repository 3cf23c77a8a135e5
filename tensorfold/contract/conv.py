"""The checks of conv.py: the causal conv of chains and trees, of a one-row window in place, and the tail a kept path
leaves."""
import numpy as np
from numba import cuda

from tensorfold.contract import KernelCheck
from tensorfold.contract.controls import drop_row, next_lane, padding_read, swap_rows
from tensorfold.cuda.conv import (causal_conv, causal_conv_kernel, causal_conv_lanes, causal_conv_lanes_kernel,
                                  causal_conv_lanes_launch, causal_conv_launch, conv_tail_after, conv_tail_after_kernel,
                                  conv_tail_after_launch)
from tensorfold.device.grid import to_host
from tensorfold.numerics import paths


def _cases(mode, rng):
    """(rows, channels, parents): fewer rows than the tail, one row, chains and trees (paths.TREES); C = 6144 (0.8B,
    2B), 8192 (4B), and odd."""
    trees = paths.TREES
    if mode == "sim":
        shapes = [(5, 3, trees["5 rows"]), (1, 5, None), (2, 3, None), (6, 7, None)]
    else:
        shapes = [(16, 6144, trees["16 rows"]), (16, 6144, trees["spine"]), (16, 8192, trees["16 rows"]),
                  (1, 6144, None), (2, 6144, None), (16, 6144, None), (128, 6144, None), (4, 8192, None),
                  (64, 8192, None), (17, 1000, None)]
    kernel = 4
    return [(f"{rows}x{channels}" + (" tree" if parents else ""), {
        "inputs": rng.normal(size=(rows, channels)).astype(np.float32),
        "tail": rng.normal(size=(kernel - 1, channels)).astype(np.float32),
        "weight": (rng.normal(size=(channels, kernel)) * 0.5).astype(np.float32),
        "taps": paths.conv_taps(parents or paths.chain(rows), kernel)}) for rows, channels, parents in shapes]


def _tail_one_row_behind(inputs):
    """Planted: the tail the stream had one row earlier (its last row missing, a zero row in front)."""
    tail = inputs["tail"]
    return {**inputs, "tail": np.concatenate([np.zeros_like(tail[:1]), tail[:-1]])}


def _taps_reversed(inputs):
    """Planted: weight[:, 0] applied to the current row (a convolution read the wrong way round)."""
    return {**inputs, "weight": np.ascontiguousarray(inputs["weight"][:, ::-1])}


def _sibling_input(inputs):
    """Planted: a tree row reads its sibling's input in place of its own (None without siblings)."""
    taps, history = inputs["taps"].copy(), len(inputs["tail"])
    pair = paths.sibling_pair([int(n) - history if n >= history else -1 for n in taps[:, -2]])
    if pair is None:
        return None
    r, sibling = pair
    taps[r, -1] = history + sibling
    return {**inputs, "taps": taps}


def _read_in_slot_order(inputs):
    """Planted: a tree's rows read their predecessors in slot order, as a chain's do (None for a chain)."""
    chain_taps = paths.conv_taps(paths.chain(len(inputs["inputs"])), inputs["weight"].shape[1])
    return None if np.array_equal(chain_taps, inputs["taps"]) else {**inputs, "taps": chain_taps}


def _launch(inputs, tail, weight, taps):
    return to_host(causal_conv_launch(*(cuda.to_device(a) for a in (inputs, tail, weight, taps))))


def _one_row_cases(mode, rng):
    """One-row windows (a decode round's), whose tail shifts in place."""
    return [(label, inputs) for label, inputs in _cases(mode, rng) if len(inputs["inputs"]) == 1]


def _launch_in_place(inputs, tail, weight, taps):
    tail = cuda.to_device(tail)
    out, new_tail = causal_conv_launch(cuda.to_device(inputs), tail, cuda.to_device(weight), cuda.to_device(taps),
                                       in_place=True)
    assert new_tail is tail
    return to_host((out, tail))


def _lanes_cases(mode, rng):
    """One row for each of several windows, each after its lane's row of a pool of tails: in the simulator 3 windows
    of 5 lanes (not in lane order, lanes left out); on GPU 16 of 16 lanes and 3 of 64, C = 6144 and 8192."""
    shapes = [(5, [3, 0, 4], 7)] if mode == "sim" else [(16, list(range(16)), 6144), (64, [40, 3, 63], 8192)]
    kernel = 4
    return [(f"{len(order)} of {lanes} lanes, C = {channels}", {
        "inputs": rng.normal(size=(len(order), channels)).astype(np.float32),
        "pool": rng.normal(size=(lanes, kernel - 1, channels)).astype(np.float32),
        "lanes": np.array(order, np.int32),
        "weight": (rng.normal(size=(channels, kernel)) * 0.5).astype(np.float32)}) for lanes, order, channels in shapes]


def _launch_lanes(inputs, pool, lanes, weight):
    pool = cuda.to_device(pool)
    out = cuda.device_array(inputs.shape, np.float32)
    causal_conv_lanes_launch(cuda.to_device(inputs), pool, cuda.to_device(lanes), cuda.to_device(weight), out)
    return to_host((out, pool))


def _tail_cases(mode, rng):
    """A kept path over a window's inputs: a chain's prefix shorter and longer than the tail, a whole chain, a tree's
    branch, and the same padded with -1 to the window's rows (as a recorded keep reads it)."""
    channels = 7 if mode == "sim" else 6144
    history, rows = 3, 16
    kept_paths = [[0], [0, 1], list(range(9)), list(range(rows)), [0, 2, 5, 9, 13], [0, 1, 3, 6]]  # paths.TREES'
    cases = []
    for path in kept_paths:
        for given in (path, paths.padded_path(path, rows)):
            cases.append((f"path {path}" + (" padded" if len(given) > len(path) else ""), {
                "tail": rng.normal(size=(history, channels)).astype(np.float32),
                "inputs": rng.normal(size=(rows, channels)).astype(np.float32), "path": given}))
    return cases


def _launch_tail_after(tail, inputs, path):
    device_tail = cuda.to_device(tail)
    assert conv_tail_after_launch(device_tail, cuda.to_device(inputs), cuda.to_device(np.asarray(path, np.int32))) \
        is device_tail
    return to_host(device_tail)


CONTRACT = [
    KernelCheck("causal_conv", causal_conv, _launch, _cases,
                {"tail one row behind": _tail_one_row_behind, "two swapped rows": swap_rows("inputs"),
                 "taps reversed": _taps_reversed, "a sibling's input in a row's window": _sibling_input,
                 "a tree read in slot order": _read_in_slot_order}, kernels=(causal_conv_kernel,)),
    KernelCheck("causal_conv in place", causal_conv, _launch_in_place, _one_row_cases,
                {"tail one row behind": _tail_one_row_behind, "taps reversed": _taps_reversed},
                kernels=(causal_conv_kernel,)),
    KernelCheck("causal_conv lanes", causal_conv_lanes, _launch_lanes, _lanes_cases,
                {"a window on the next lane's tail": next_lane("pool"),
                 "two windows' rows swapped": swap_rows("inputs"), "taps reversed": _taps_reversed},
                kernels=(causal_conv_lanes_kernel,)),
    KernelCheck("conv_tail_after", conv_tail_after, _launch_tail_after, _tail_cases,
                {"a dropped row": drop_row("path", row=0), "two swapped rows": swap_rows("path", a=-2, b=-1),
                 "a padding entry read as a row": padding_read("path")}, kernels=(conv_tail_after_kernel,)),
]
