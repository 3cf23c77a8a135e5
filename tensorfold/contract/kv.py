"""The checks of kv.py: a window's keys and values written at their cache rows, and a kept path's rows moved down."""
import itertools

import numpy as np
from numba import cuda

from tensorfold.contract import KernelCheck
from tensorfold.contract.controls import off_by, padding_read, swap_rows
from tensorfold.cuda.kv import (kv_compact, kv_compact_kernel, kv_compact_launch, kv_write, kv_write_kernel,
                                kv_write_launch)
from tensorfold.device.grid import to_host
from tensorfold.numerics import paths


def _compact_cases(mode, rng):
    """A kept path of a window over a stream's committed keys: the cache rows from committed + slot to + depth."""
    if mode == "sim":
        shapes = [(2, 1, 3, [-1, 0, 0, 1, 2], [0, 2, 4]), (5, 2, 4, paths.TREES["5 rows"], [0, 1, 4])]
    else:
        tree, spine = paths.TREES["16 rows"], paths.TREES["spine"]
        shapes = [(8190, 2, 256, tree, [0, 2, 5, 9, 13]), (8300, 2, 256, tree, [0, 1, 4, 8, 12]),
                  (4000, 4, 256, spine, list(range(14)) + [15]), (100, 2, 256, tree, [0, 1, 3, 6, 10, 14])]
    cases = []
    for committed, kv_heads, head_dim, parents, path in shapes:
        assert all(parents[b] == a for a, b in itertools.pairwise(path)), "a path follows parents"
        cache = committed + len(parents) + 3
        cases.append((f"path {path} over {committed}" if mode == "sim" else f"a path of {len(path)} over {committed}",
                      {"keys": rng.normal(size=(cache, kv_heads, head_dim)).astype(np.float32),
                       "values": rng.normal(size=(cache, kv_heads, head_dim)).astype(np.float32),
                       "committed": committed, "path": path}))
    last = cases[-1][1]  # the same path padded with -1 to its window's rows, as a recorded keep reads it
    cases.append((cases[-1][0] + " padded", {**last, "path": paths.padded_path(last["path"], len(shapes[-1][3]))}))
    return cases


def _write_cases(mode, rng):
    """A window's rows written after a stream's committed keys (rows, Hkv, hd, committed)."""
    shapes = [(3, 1, 8, 5), (1, 2, 4, 0)] if mode == "sim" else [(1, 2, 256, 4095), (16, 2, 256, 8190),
                                                                 (128, 2, 256, 872), (16, 4, 256, 0)]
    cases = []
    for rows, kv_heads, head_dim, committed in shapes:
        cache = committed + rows + 3
        cases.append((f"{rows} rows over {committed}", {
            "keys": rng.normal(size=(cache, kv_heads, head_dim)).astype(np.float32),
            "values": rng.normal(size=(cache, kv_heads, head_dim)).astype(np.float32),
            "new_keys": rng.normal(size=(rows, kv_heads, head_dim)).astype(np.float32),
            "new_values": rng.normal(size=(rows, kv_heads, head_dim)).astype(np.float32),
            "at": np.arange(committed, committed + rows, dtype=np.int32)}))
    return cases


def _write_twin(keys, values, new_keys, new_values, at):
    return kv_write(keys.copy(), values.copy(), new_keys, new_values, at)


def _write_on_device(keys, values, new_keys, new_values, at):
    return to_host(kv_write_launch(*(cuda.to_device(a) for a in (keys, values, new_keys, new_values, at))))


def _compact_twin(keys, values, committed, path):
    return kv_compact(keys.copy(), values.copy(), committed, path)


def _compact_on_device(keys, values, committed, path):
    """The length and the path as a recorded keep gives them: int32 on the device."""
    return to_host(kv_compact_launch(cuda.to_device(keys), cuda.to_device(values),
                                     cuda.to_device(np.array([committed], np.int32)),
                                     cuda.to_device(np.asarray(path, np.int32))))


def _depth_off_by_one(inputs):
    """Planted: every kept row moved one depth too deep (the path's first row kept twice)."""
    return {**inputs, "path": [inputs["path"][0]] + list(inputs["path"])}


CONTRACT = [
    KernelCheck("kv_write", _write_twin, _write_on_device, _write_cases,
                {"rows one position late": off_by("at"), "two swapped rows": swap_rows("new_keys")},
                kernels=(kv_write_kernel,)),
    KernelCheck("kv_compact", _compact_twin, _compact_on_device, _compact_cases,
                {"committed off by one": off_by("committed"), "a row's depth off by one": _depth_off_by_one,
                 "two path rows swapped": swap_rows("path", a=-2, b=-1),
                 "a padding entry read as a row": padding_read("path")}, kernels=(kv_compact_kernel,)),
]
