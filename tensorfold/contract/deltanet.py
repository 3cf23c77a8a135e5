"""The checks of deltanet.py: the scan's inputs, the scan of chains and trees, and the replay of its log."""
import numpy as np
from numba import cuda

from tensorfold.contract import KernelCheck
from tensorfold.contract.controls import drop_row, next_lane, padding_read, swap_rows, times
from tensorfold.cuda.deltanet import (
    ROWS_STAGED,
    deltanet_apply,
    deltanet_apply_kernel,
    deltanet_apply_launch,
    deltanet_gates,
    deltanet_scan,
    deltanet_scan_lanes,
    deltanet_scan_lanes_launch,
    deltanet_scan_launch,
    scan_inputs,
    scan_inputs_kernel,
    scan_inputs_launch,
    scan_kernel,
)
from tensorfold.cuda.rmsnorm import l2norm
from tensorfold.device.grid import to_host
from tensorfold.numerics import paths


def _across_tiles(tile):
    """The parents of a tree of 2 * tile + 3 rows whose rebuilt rows cross the scan's tiles. With tiles of 16: a
    chain into the second tile, row 18 branching back to row 3 of the first, then in the last, partial tile row 32
    (its first) branching to row 16, row 33 to row 20 and row 34 to row 32, an ancestor logged earlier in its tile."""
    return list(range(-1, tile + 1)) + [3] + list(range(tile + 2, 2 * tile - 1)) + [tile, tile + 4, 2 * tile]


def _heads(mode):
    """(rows, nv, nk, dk, dv, parents): tiny in the simulator, one of them with a head wider than a scan block
    (dv = 70: a second block, mostly past the last column), a drafted window's 16-row tree (one whole scan tile),
    and 2 ROWS_STAGED + 3 rows (three tiles, the last partial) as a chain and as `_across_tiles`; on GPU 0.8B/2B
    (16/16 heads of 128), 4B (32/16), an odd dv, the tree across tiles and a prefill's 2,048-row chain; chains
    (parents None) and the trees of paths.TREES."""
    trees, tiles, across = paths.TREES, 2 * ROWS_STAGED + 3, _across_tiles(ROWS_STAGED)
    if mode == "sim":
        return [(5, 2, 1, 3, 4, trees["5 rows"]), (3, 4, 2, 8, 6, None), (1, 2, 2, 5, 3, None), (4, 2, 1, 3, 7, None),
                (2, 2, 1, 3, 70, None), (16, 2, 1, 3, 4, trees["16 rows"]), (tiles, 2, 1, 8, 8, None),
                (tiles, 2, 2, 8, 8, across)]
    return [(16, 16, 16, 128, 128, trees["16 rows"]), (16, 16, 16, 128, 128, trees["spine"]),
            (16, 32, 16, 128, 128, trees["16 rows"]), (5, 6, 2, 96, 37, trees["5 rows"]),
            (tiles, 16, 16, 128, 128, across), (1, 16, 16, 128, 128, None), (4, 16, 16, 128, 128, None),
            (16, 16, 16, 128, 128, None), (64, 16, 16, 128, 128, None), (16, 32, 16, 128, 128, None),
            (5, 16, 16, 128, 100, None), (7, 6, 2, 96, 37, None), (2048, 16, 16, 128, 128, None)]


def _gate_inputs(rng, rows, nv):
    return {"b": rng.normal(size=(rows, nv)).astype(np.float32),
            "a": (rng.normal(size=(rows, nv)) * 4).astype(np.float32),
            "a_log": rng.normal(size=nv).astype(np.float32), "dt_bias": rng.normal(size=nv).astype(np.float32)}


def _input_cases(mode, rng):
    """(rows, heads, dk, v width, nv): in the simulator a v width that is not a multiple of the block, a head wider
    than it and more value heads than threads; on GPU Qwen3.5's DeltaNet (16 heads of 128, v 2,048, nv 16) at 1, 16
    and 128 rows, and the 4B's (v 4,096, nv 32)."""
    shapes = ([(3, 2, 40, 150, 4), (1, 1, 130, 7, 5), (2, 1, 8, 3, 200)] if mode == "sim" else
              [(1, 16, 128, 2048, 16), (16, 16, 128, 2048, 16), (128, 16, 128, 2048, 16), (5, 16, 128, 4096, 32)])
    cases = []
    for rows, heads, dk, width, nv in shapes:
        conv = rng.normal(size=(rows, 2 * heads * dk + width)).astype(np.float32)
        cases.append((f"{rows}x{heads}x{dk}+{width}, {nv} gates", {
            "conv": conv, **_gate_inputs(rng, rows, nv), "heads": heads, "dk": dk, "eps": 1e-6,
            "q_scale": dk ** -0.5}))
    return cases


def _heads_swapped(inputs):
    """Planted: the first query head and the first key head trade places in every row."""
    conv, dk, heads = inputs["conv"].copy(), inputs["dk"], inputs["heads"]
    first_key = slice(heads * dk, heads * dk + dk)
    conv[:, :dk], conv[:, first_key] = inputs["conv"][:, first_key], inputs["conv"][:, :dk]
    return {**inputs, "conv": conv}


def _scan_cases(mode, rng):
    cases = []
    for rows, nv, nk, dk, dv, parents in _heads(mode):
        decay, beta = deltanet_gates(**_gate_inputs(rng, rows, nv))
        parents = parents or paths.chain(rows)
        cases.append((f"{rows} rows, {nv}/{nk} heads, {dk}x{dv}" + (" tree" if parents[-1] != rows - 2 else ""), {
            "state": (rng.normal(size=(nv, dk, dv)) * 0.1).astype(np.float32),
            "q": l2norm(rng.normal(size=(rows, nk, dk)).astype(np.float32), 1e-6, scale=dk ** -0.5),
            "k": l2norm(rng.normal(size=(rows, nk, dk)).astype(np.float32), 1e-6),
            "v": rng.normal(size=(rows, nv, dv)).astype(np.float32), "decay": decay, "beta": beta,
            "depths": paths.depths(parents), "path_slots": paths.path_slots(parents)}))
    return cases


def _apply_cases(mode, rng):
    """A scan's log replayed along every row, along a path that skips a row (a chain's accepted rows) and along the
    path to a tree's last row; and a chain's first rows padded with -1 to the window's rows (a recorded keep's)."""
    cases = []
    for label, inputs in _scan_cases(mode, rng):
        _, _, (decay, delta, key) = deltanet_scan(**inputs)
        rows, depths, slots = len(decay), inputs["depths"], inputs["path_slots"]
        replays = [list(range(rows))] + ([[r for r in range(rows) if r != rows // 2]] if rows > 2 else [])
        replays += [list(slots[-1, :depths[-1] + 1])] if depths[-1] != rows - 1 else []
        replays += [paths.padded_path(range(rows // 2 + 1), rows)] if rows > 1 else []
        cases.extend((f"{label}, path {[int(r) for r in path]}" if mode == "sim" else f"{label}, path of {len(path)}",
                      {"state": inputs["state"], "decay": decay, "delta": delta, "key": key, "path": path})
                     for path in replays)
    return cases


def _parent_swapped(inputs):
    """Planted: a tree row starts from the state of another row at its parent's depth (None if none has one)."""
    depths, slots = inputs["depths"], inputs["path_slots"].copy()
    for r in reversed(range(len(depths))):
        others = [u for u in range(r) if depths[u] == depths[r] - 1 and u != slots[r, depths[r] - 1]]
        if depths[r] > 0 and others:
            slots[r, :depths[r]] = slots[others[0], :depths[r]]  # that row's path in place of the parent's
            return {**inputs, "path_slots": slots}
    return None


def _depth_off_by_one(inputs):
    """Planted: a row two or more deep starts from its grandparent's state (None if no row is that deep)."""
    depths = inputs["depths"].copy()
    deep = [r for r in range(len(depths)) if depths[r] >= 2]
    if not deep:
        return None
    depths[deep[-1]] -= 1
    return {**inputs, "depths": depths}


def _read_in_slot_order(inputs):
    """Planted: a tree's rows each start from the row before them, as a chain's do (None for a chain)."""
    chain = paths.chain(len(inputs["q"]))
    if np.array_equal(inputs["depths"], paths.depths(chain)):
        return None
    return {**inputs, "depths": paths.depths(chain), "path_slots": paths.path_slots(chain)}


def _dev(*arrays):
    return [cuda.to_device(np.ascontiguousarray(a)) for a in arrays]


def _launch_inputs(conv, b, a, a_log, dt_bias, heads, dk, eps, q_scale):
    return to_host(scan_inputs_launch(*_dev(conv, b, a, a_log, dt_bias), heads, dk, eps, q_scale))


def _twin_scan(state, q, k, v, decay, beta, depths, path_slots):
    out, new_state, log = deltanet_scan(state, q, k, v, decay, beta, depths, path_slots)
    return (out, new_state, *log)  # flat, for the byte comparison


def _launch_scan(state, q, k, v, decay, beta, depths, path_slots):
    out, new_state, log = deltanet_scan_launch(*_dev(state, q, k, v, decay, beta, depths, path_slots))
    return to_host((out, new_state, *log))


def _lanes_cases(mode, rng):
    """One row for each of several windows, each from its lane's row of a pool: in the simulator 3 windows of a
    pool of 5 lanes (not in lane order, a lane left out), and 2 windows over heads of two scan blocks (each window's
    log from another block); on GPU 16 windows of 16 lanes and 3 of 64, at Qwen3.5's DeltaNet (16 heads of 128) and
    the 4B's (32 value heads)."""
    shapes = [(5, [3, 0, 4], 2, 1, 3, 4), (4, [1, 2, 3], 4, 2, 8, 6), (3, [2, 0], 2, 1, 3, 40)] if mode == "sim" else [
        (16, list(range(16)), 16, 16, 128, 128), (64, [40, 3, 63], 16, 16, 128, 128), (4, [2, 0], 32, 16, 128, 128)]
    cases = []
    for lanes, order, nv, nk, dk, dv in shapes:
        windows = len(order)
        decay, beta = deltanet_gates(**_gate_inputs(rng, windows, nv))
        cases.append((f"{windows} of {lanes} lanes, {nv}/{nk} heads, {dk}x{dv}", {
            "pool": (rng.normal(size=(lanes, nv, dk, dv)) * 0.1).astype(np.float32),
            "lanes": np.array(order, np.int32),
            "q": l2norm(rng.normal(size=(windows, nk, dk)).astype(np.float32), 1e-6, scale=dk ** -0.5),
            "k": l2norm(rng.normal(size=(windows, nk, dk)).astype(np.float32), 1e-6),
            "v": rng.normal(size=(windows, nv, dv)).astype(np.float32), "decay": decay, "beta": beta}))
    return cases


def _twin_lanes(pool, lanes, q, k, v, decay, beta):
    out, pool, log = deltanet_scan_lanes(pool, lanes, q, k, v, decay, beta)
    return (out, pool, *log)  # flat, for the byte comparison


def _launch_lanes(pool, lanes, q, k, v, decay, beta):
    pool, lanes, *rows = _dev(pool, lanes, q, k, v, decay, beta)
    out = cuda.device_array((q.shape[0], *v.shape[1:]), np.float32)
    log = deltanet_scan_lanes_launch(pool, lanes, *rows, out)
    return to_host((out, pool, *log))


def _twin_apply(state, decay, delta, key, path):
    return deltanet_apply(state, (decay, delta, key), path)


def _launch_apply(state, decay, delta, key, path):
    state, *log = _dev(state, decay, delta, key)
    return to_host(deltanet_apply_launch(state, tuple(log), cuda.to_device(np.asarray(path, np.int32))))


_SCAN_ROWS = ("q", "k", "v", "decay", "beta")
CONTRACT = [
    KernelCheck("scan_inputs", scan_inputs, _launch_inputs, _input_cases,
                {"two swapped rows": swap_rows("conv", "b", "a"), "gates of another row": swap_rows("b", "a"),
                 "eps off by a factor of ten": times("eps", 10), "q and k heads swapped": _heads_swapped},
                kernels=(scan_inputs_kernel,)),
    KernelCheck("deltanet_scan", _twin_scan, _launch_scan, _scan_cases,
                {"two swapped rows": swap_rows(*_SCAN_ROWS), "a dropped row": drop_row(*_SCAN_ROWS),
                 "a parent swapped": _parent_swapped, "a depth off by one": _depth_off_by_one,
                 "a tree read in slot order": _read_in_slot_order}, kernels=(scan_kernel,)),
    KernelCheck("deltanet_scan lanes", _twin_lanes, _launch_lanes, _lanes_cases,
                {"a window on the next lane's state": next_lane("pool"),
                 "two windows' rows swapped": swap_rows(*_SCAN_ROWS)},
                kernels=(scan_kernel,)),
    KernelCheck("deltanet_apply", _twin_apply, _launch_apply, _apply_cases,
                {"a dropped row": drop_row("path", row=None), "two swapped rows": swap_rows("path"),
                 "a padding entry read as a row": padding_read("path")}, kernels=(deltanet_apply_kernel,)),
]
