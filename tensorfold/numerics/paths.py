"""A window's rows as paths, and the index maps that let one launch run every row of a chain or a tree.

A window's rows are given by `parents`: parents[r] is the row that row r follows, -1 for row 0 (which follows the
stream), always an earlier row; a chain's parents are r - 1. Row r's *path* is the window slots of its ancestors,
root first, then its own; its depth is the number of ancestors. Siblings share a depth and never see each other.

    parents  -1  0  0  1  1                  path_slots          depths     conv_taps (K = 4; tail rows 0 .. 2,
                                                                             the window's inputs at 3 + slot)
    slot 0 --+-- 1 --+-- 3                   row 0: 0 . .        0          row 0: 0 1 2 3
             |       +-- 4                   row 1: 0 1 .        1          row 1: 1 2 3 4
             +-- 2                           row 2: 0 2 .        1          row 2: 1 2 3 5
                                             row 3: 0 1 3        2          row 3: 2 3 4 6
                                             row 4: 0 1 4        2          row 4: 2 3 4 7

Every row reads the stream's committed history and then its own path, so it computes what the one-row step it
stands for computes:

* attention: row r reads logical keys 0 .. length + depth(r); key j < length is cache row j, key length + d is
  cache row length + path_slots[r, d] (the window's rows are written at length + slot);
* the conv: row r's window of K inputs is the last K of [the stream's tail; its path's inputs] (`conv_taps`);
* the DeltaNet scan: row r starts from its parent's state, path_slots[r, depth(r) - 1].

A chain's maps are the identity (path_slots[r, d] = d), so chains and trees run through the same kernels. Entries of
path_slots past a row's depth are 0 and never read.

A *kept path* (the rows a stream keeps after its walk) may be given padded to a fixed length with -1: its first
negative entry ends it (`until_end`), as a recorded keep reads it from a buffer of the window's rows.
"""
import numpy as np

# Trees the kernel contracts run: the one above; 16 rows with siblings at every level (depth 5, the test_lanes
# tree); and a spine of 15 rows with a sibling at its tip (depth 14: the deepest path a 16-row window can hold).
TREES = {"5 rows": [-1, 0, 0, 1, 1], "16 rows": [-1, 0, 0, 1, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9, 10, 11],
         "spine": list(range(-1, 14)) + [13]}


def chain(rows: int) -> list:
    """The parents of a chain: each row follows the one before it."""
    return list(range(-1, rows - 1))


def depths(parents) -> np.ndarray:
    """[rows] int32: how many ancestors each row has in the window."""
    out = []
    for parent in parents:
        out.append(0 if parent < 0 else out[parent] + 1)
    return np.array(out, np.int32)


def row_paths(parents) -> list:
    """Each row's path as a list: its ancestors' slots, root first, then its own. (Lists, not arrays: a recorded
    tree round builds its maps on the host every round, and NumPy's per-call cost would dominate at 16 rows.)"""
    out = []
    for r, parent in enumerate(parents):
        out.append((out[parent] if parent >= 0 else []) + [r])
    return out


def path_slots(parents) -> np.ndarray:
    """[rows, deepest + 1] int32: row r's path, its ancestors' slots root first, then r at column depth(r)."""
    paths = row_paths(parents)
    deepest = max(len(path) for path in paths)
    return np.array([path + [0] * (deepest - len(path)) for path in paths], np.int32)


def conv_tap_rows(parents, width: int) -> list:
    """`conv_taps` as lists."""
    history = width - 1
    taps = []
    for r, parent in enumerate(parents):  # the parent's window less its oldest, or the tail; then its own input
        taps.append((taps[parent][1:] if parent >= 0 else list(range(history))) + [history + r])
    return taps


def conv_taps(parents, width: int) -> np.ndarray:
    """[rows, width] int32: row r's conv window, oldest first, as rows of [tail (width - 1 rows); window inputs]:
    the inputs of its nearest ancestors running on into the tail, then its own."""
    return np.array(conv_tap_rows(parents, width), np.int32)


def sibling_pair(parents):
    """(r, s): the last row that has a sibling, and that sibling (None when no row has one); for planted controls."""
    for r in range(len(parents) - 1, 0, -1):
        for s in range(1, len(parents)):
            if s != r and parents[s] == parents[r]:
                return r, s
    return None


def until_end(path) -> list:
    """A kept path's rows up to its first negative entry (all of them if it has none)."""
    rows = [int(r) for r in path]
    ends = [n for n, r in enumerate(rows) if r < 0]
    return rows[:ends[0]] if ends else rows


def padded_path(path, rows: int) -> np.ndarray:
    """int32 [rows]: a kept path, then -1 to the end (the form a recorded keep reads)."""
    padded = np.full(rows, -1, np.int32)
    padded[:len(path)] = path
    return padded


def parents_from(path_slots, depths) -> list:
    """The parents that `path_slots` and `depths` were built from (for planted controls that read a case's maps)."""
    return [int(path_slots[r, d - 1]) if d > 0 else -1 for r, d in enumerate(depths)]
