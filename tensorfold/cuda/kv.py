"""The attention cache's writes: a window's keys and values written at their rows, and a kept tree path moved down.

A window's keys and values go into the cache with `kv_write`: row r to cache row at[r] (the stream's length + the
row's slot in the window, attention.py), read from device memory, so that a recorded decode round (graphs.py) writes
where each replay's stream length says. Keeping a tree path moves its rows from committed + slot to committed + depth
(`kv_compact`), so that the stream's committed keys sit in order again; a chain's kept rows are already there.

Mapping (the kernels): write, one thread per element of the window's keys (and the same element of its values);
compact, one thread per (KV head, dim), moving that element of each path row in increasing depth.
"""
import numpy as np
from numba import cuda

from tensorfold.device.grid import BLOCK, blocks_for, device_int32
from tensorfold.device.launch import kernel
from tensorfold.numerics import paths


def kv_write(keys, values, new_keys, new_values, at):
    """Write a window's rows into the cache in place: new_keys[r] and new_values[r] [rows, Hkv, hd] to cache row
    at[r] (int [rows])."""
    keys[np.asarray(at)] = new_keys
    values[np.asarray(at)] = new_values
    return keys, values


def kv_compact(keys, values, committed, path):
    """Move a kept path's key and value rows from committed + slot to committed + depth, in place, depth by depth
    (the path up to its first negative entry, `paths.until_end`).

    In increasing depth the moves never overwrite a row still to be read: slots rise along a path and slot >= depth,
    so the row written at depth d (committed + d) is no later row's source (their slots are > d), and row d's own
    source has not been written yet (earlier moves wrote rows < d <= its slot).
    """
    for depth, slot in enumerate(paths.until_end(path)):
        keys[committed + depth] = keys[committed + slot]
        values[committed + depth] = values[committed + slot]
    return keys, values


# --- the kernels --------------------------------------------------------------------------------------------------

@kernel
def kv_write_kernel(keys, values, new_keys, new_values, at):
    """Thread i owns element (r, h, d) of the window's rows, i = (r * Hkv + h) * head_dim + d."""
    i = cuda.grid(1)
    heads, head_dim = new_keys.shape[1], new_keys.shape[2]
    if i < new_keys.size:
        r, h, d = i // (heads * head_dim), (i // head_dim) % heads, i % head_dim
        keys[at[r], h, d] = new_keys[r, h, d]
        values[at[r], h, d] = new_values[r, h, d]


@kernel
def kv_compact_kernel(keys, values, committed, path):
    """Thread i owns element (h, d) of a KV row, i = h * head_dim + d, and moves it for each depth in turn;
    committed[0] is the stream's length (device memory: a recorded keep's changes per replay)."""
    i = cuda.grid(1)
    head_dim = keys.shape[2]
    h, d = i // head_dim, i % head_dim
    length = committed[0]
    if h < keys.shape[1]:
        for depth in range(path.shape[0]):  # in increasing depth (see kv_compact)
            if path[depth] < 0:  # the path's end
                break
            keys[length + depth, h, d] = keys[length + path[depth], h, d]
            values[length + depth, h, d] = values[length + path[depth], h, d]


def kv_write_launch(keys, values, new_keys, new_values, at, stream=0):
    """Write new_keys, new_values [rows, Hkv, hd] to cache rows at [rows] (int32) of the device buffers keys and
    values [N, Hkv, hd], in place; returns them."""
    kv_write_kernel[blocks_for(new_keys.size), BLOCK, stream](keys, values, new_keys, new_values, at)
    return keys, values


def kv_compact_launch(keys, values, committed, path, stream=0):
    """Move the rows of `path` to committed + depth in the device buffers keys and values [N, Hkv, hd], in place;
    returns them. `committed` an int, or int32 [1] on the device; `path` a host list of window slots, or int32 on
    the device ended by its first negative entry (a recorded keep's; host values are uploaded)."""
    committed = device_int32([committed] if isinstance(committed, (int, np.integer)) else committed, stream)
    slots = device_int32(path, stream)
    kv_compact_kernel[blocks_for(keys.shape[1] * keys.shape[2]), BLOCK, stream](keys, values, committed, slots)
    return keys, values
