"""The checks of attention.py: the partials over chunks of keys, their merge, both together, and the cache's
writes and moves."""
import numpy as np
from numba import cuda

from tensorfold.contract import KernelCheck
from tensorfold.contract.controls import off_by, roll, swap_rows
from tensorfold.cuda.attention import (
    CHUNK,
    ROUND_ROWS,
    attention_merge,
    attention_merge_kernel,
    attention_merge_launch,
    attention_partial,
    attention_partial_kernel,
    attention_partial_launch,
    attention_partial_tile_kernel,
    tile_rows,
)
from tensorfold.device.grid import to_host
from tensorfold.numerics import paths


def _cases(mode, rng):
    """Rows read keys in place (rows, Hq, Hkv, hd, n_keys of the rows), or a window of a chain or a tree (paths.TREES)
    over a stream's committed keys (rows, Hq, Hkv, hd, (committed, parents)). The cache holds a few keys past the
    longest row, and a window's path_slots one column past its deepest row (as a grown cache does), so that a
    kernel reading one key too many reads real data."""
    trees = paths.TREES
    if mode == "sim":  # every partial block costs the simulator about half a second: a few blocks only
        shapes = [(3, 1, 1, 8, (128, [-1, 0, 0])), (1, 2, 1, 8, [5]),
                  (1, 1, 1, 40, [6])]  # head dims past one batch of LOADS, the last batch short
    else:
        mixed = [1, 4096, 127, 128, 129, 300, 1000, 2] + list(rng.integers(1, 4097, 8))
        shapes = [(16, 8, 2, 256, (8190, trees["16 rows"])),  # rows at depth 2 and deeper past the 8,192 boundary
                  (16, 8, 2, 256, (8300, trees["16 rows"])), (16, 8, 2, 256, (8180, trees["spine"])),
                  (16, 16, 4, 256, (125, trees["16 rows"])), (16, 8, 2, 256, (4090, paths.chain(16))),
                  (128, 8, 2, 256, (872, paths.chain(128))),  # a prompt chunk of 128 rows ending at position 999
                  (16, 8, 2, 256, mixed), (1, 8, 2, 256, [1]), (1, 8, 2, 256, [127]), (1, 8, 2, 256, [128]),
                  (1, 8, 2, 256, [129]), (1, 8, 2, 256, [300]), (1, 8, 2, 256, [4096]),
                  (128, 8, 2, 256, [1] + list(rng.integers(1, 301, 127))),
                  (16, 16, 4, 256, mixed),  # Qwen3.5-4B's heads
                  (2, 4, 2, 80, [37, 200])]  # head dims that are not whole batches of LOADS
    cases = []
    for rows, heads, kv_heads, head_dim, reads in shapes:
        maps = {"committed": None, "path_slots": None}
        if isinstance(reads, tuple):
            committed, parents = reads
            n_keys = committed + paths.depths(parents) + 1
            slots = paths.path_slots(parents)
            maps = {"committed": committed, "path_slots": np.pad(slots, ((0, 0), (0, 1)))}
        else:
            n_keys = np.array(reads)
        cache = max(int(n_keys.max()), (maps["committed"] or 0) + rows) + 3  # a window's rows sit at committed + slot
        label = f"{rows}x{heads}/{kv_heads}x{head_dim} n<={n_keys.max()}"
        cases.append((label + (f" window over {maps['committed']}" if maps["committed"] else ""), {
            "q": rng.normal(size=(rows, heads, head_dim)).astype(np.float32),
            "keys": rng.normal(size=(cache, kv_heads, head_dim)).astype(np.float32),
            "values": rng.normal(size=(cache, kv_heads, head_dim)).astype(np.float32),
            "n_keys": n_keys.astype(np.int64), "scale": 1.0 / np.sqrt(head_dim), "chunk": CHUNK, **maps}))
    return cases


def _partial_twin(q, keys, values, n_keys, scale, chunk, committed, path_slots):
    return attention_partial(q, keys, values, n_keys, scale, committed, path_slots)  # the twin's chunk is CHUNK


def _partial_on_device(q, keys, values, n_keys, scale, chunk, committed, path_slots, tile=None):
    """The partials on the device; `tile` names the kernel of rows that read their keys in place (None: the
    launch's choice)."""
    slots = None if path_slots is None else cuda.to_device(path_slots.astype(np.int32))
    return attention_partial_launch(cuda.to_device(q), cuda.to_device(keys), cuda.to_device(values),
                                    cuda.to_device(np.asarray(n_keys, np.int32)), scale, committed, slots,
                                    max_keys=int(np.max(n_keys)), chunk=chunk, tile=tile)


def _merge_cases(mode, rng):
    """The partials of the attention cases, every other one (the second, the fourth, ...) with an output gate: a
    q_proj output [rows, Hq, 2 hd], each head's query then its gate."""
    cases = []
    for label, inputs in _cases(mode, rng):
        if mode == "sim" or len(inputs["q"]) > 1:
            partials = dict(zip("mlo", _partial_twin(**inputs)))
            gated = len(cases) % 2 == 1
            rows, heads, head_dim = inputs["q"].shape
            q_and_gate = (rng.normal(size=(rows, heads, 2 * head_dim)) * 4).astype(np.float32) if gated else None
            cases.append((label + (" gated" if gated else ""), {**partials, "q_and_gate": q_and_gate}))
    return cases


def _merge_on_device(m, l, o, q_and_gate):
    return to_host(attention_merge_launch(*(cuda.to_device(a) for a in (m, l, o)),
                                          q_and_gate=None if q_and_gate is None else cuda.to_device(q_and_gate)))


def _query_as_gate(inputs):
    """Planted: the merge reads each head's first half (the query) as its gate."""
    q_and_gate = inputs["q_and_gate"]
    if q_and_gate is None:
        return None
    return {**inputs, "q_and_gate": np.ascontiguousarray(np.roll(q_and_gate, q_and_gate.shape[2] // 2, axis=2))}


def _reversed_chunks(inputs):
    """Planted: the merge walks the chunks last to first."""
    return {**inputs, **{name: np.ascontiguousarray(np.flip(inputs[name], axis=2)) for name in "mlo"}}


def _window_parents(inputs):
    """The parents a window case's path_slots were built from (None for rows that read keys in place)."""
    if inputs["path_slots"] is None:
        return None
    return paths.parents_from(inputs["path_slots"], inputs["n_keys"] - inputs["committed"] - 1)


def _sibling_key(inputs):
    """Planted: a tree row reads its sibling's key in place of its own (None without siblings)."""
    pair = paths.sibling_pair(_window_parents(inputs) or [])
    if pair is None:
        return None
    r, sibling = pair
    slots = inputs["path_slots"].copy()
    slots[r, inputs["n_keys"][r] - inputs["committed"] - 1] = sibling
    return {**inputs, "path_slots": slots}


def _read_in_slot_order(inputs):
    """Planted: a tree's rows read the window's rows in slot order, as a chain's do (None for a chain)."""
    parents = _window_parents(inputs)
    if parents is None or parents == paths.chain(len(parents)):
        return None
    chain_slots = np.tile(np.arange(inputs["path_slots"].shape[1], dtype=np.int32), (len(parents), 1))
    return {**inputs, "path_slots": chain_slots}


def _tile_cases(mode, rng):
    """Prompt chunks and drafted chains: more than one row that read their keys in place, on the tile kernel
    (rows, Hq, Hkv, hd, n_keys of the rows), in the tiles of both (`tile_rows`). A tile is partial (the last of a
    prompt chunk, or of a chain); consecutive rows' counts cross a chunk boundary inside a tile, and one case's counts
    are in no order. The cache holds a few keys past the longest row, so that a tile loading one key too many reads
    real data."""
    prompt = ROUND_ROWS + 1  # the fewest rows of a prompt's tiles
    if mode == "sim":  # every block costs the simulator half a second or more: a few blocks only
        shapes = [(prompt + 2, 1, 1, 8, np.arange(112, 112 + prompt + 2)),  # two chunks, two tiles
                  (prompt, 4, 2, 40,  # head dims in two pieces, the second short; two query heads a KV head
                   rng.integers(1, CHUNK + 1, prompt)),
                  (6, 1, 1, 8, np.arange(CHUNK - 3, CHUNK + 3)),  # a chain of two round tiles, across a chunk boundary
                  (2, 1, 1, 8, np.arange(CHUNK, CHUNK + 2))]  # a chain of two rows
    else:  # the small ones first: a control turns red on the first case that catches it (no 2,048-row case: its
        # twin takes minutes on the host, and its tiles are those of the 512-row cases)
        shapes = [(16, 8, 2, 256, np.arange(4090, 4106)),  # a drafted chain of 16 rows across the 4,096 boundary
                  (2, 8, 2, 256, np.arange(1, 3)), (5, 16, 4, 256, np.arange(300, 305)),  # short chains
                  (33, 16, 4, 256, np.arange(301, 334)),  # Qwen3.5-4B's heads, a tile of one row
                  (128, 8, 2, 256, np.arange(873, 1001)),  # a prompt chunk of 128 rows ending at position 999
                  (200, 8, 2, 256, rng.integers(1, 1001, 200)),  # counts in no order
                  (512, 8, 2, 256, np.arange(1, 513)),  # a prompt's first 512 rows
                  (512, 8, 2, 256, np.arange(3489, 4001))]  # a chunk of 512 rows ending at position 4,000
    cases = []
    for rows, heads, kv_heads, head_dim, n_keys in shapes:
        assert rows > 1, "the launch gives the tile kernel more than one row"
        cache = int(n_keys.max()) + 3
        cases.append((f"{rows}x{heads}/{kv_heads}x{head_dim} n {n_keys.min()}..{n_keys.max()}", {
            "q": rng.normal(size=(rows, heads, head_dim)).astype(np.float32),
            "keys": rng.normal(size=(cache, kv_heads, head_dim)).astype(np.float32),
            "values": rng.normal(size=(cache, kv_heads, head_dim)).astype(np.float32),
            "n_keys": n_keys.astype(np.int64), "scale": 1.0 / np.sqrt(head_dim), "chunk": CHUNK,
            "committed": None, "path_slots": None}))
    return cases


def _tile_longest(inputs):
    """Planted: every row of a tile reads as many keys as the tile's longest row (None where they already do)."""
    n_keys = inputs["n_keys"]
    rows_a_block = tile_rows(len(n_keys))
    tiles = np.arange(0, len(n_keys), rows_a_block)  # each tile's first row
    longest = np.repeat(np.maximum.reduceat(n_keys, tiles), rows_a_block)[:len(n_keys)]  # its tile's max, row by row
    return None if np.array_equal(longest, n_keys) else {**inputs, "n_keys": longest}


_CONTROLS = {"a moved chunk boundary": lambda i: {**i, "chunk": CHUNK // 2}, "n_keys off by one": off_by("n_keys"),
             "two swapped rows": swap_rows("q"), "a sibling's key in a row's place": _sibling_key,
             "a tree read in slot order": _read_in_slot_order}
_TILE_CONTROLS = {"a moved chunk boundary": lambda i: {**i, "chunk": CHUNK // 2}, "n_keys off by one": off_by("n_keys"),
                  "two swapped rows": swap_rows("q"), "a neighbour row's key count": roll("n_keys", axis=0),
                  "every row reading its tile's longest count": _tile_longest, "two keys swapped": swap_rows("keys"),
                  "the next KV head's keys": roll("keys")}
CONTRACT = [
    KernelCheck("attention_partial", _partial_twin, lambda **i: to_host(_partial_on_device(**i, tile=False)),
                _cases, _CONTROLS, kernels=(attention_partial_kernel,)),
    KernelCheck("attention_partial_tile", _partial_twin, lambda **i: to_host(_partial_on_device(**i, tile=True)),
                _tile_cases, _TILE_CONTROLS, kernels=(attention_partial_tile_kernel,)),
    KernelCheck("attention_merge", attention_merge, _merge_on_device, _merge_cases,
                {"two swapped rows": swap_rows("o"), "chunks merged in reverse": _reversed_chunks,
                 "the next head's gate": roll("q_and_gate"), "the query read as the gate": _query_as_gate},
                kernels=(attention_merge_kernel,)),
    KernelCheck("attention", lambda **i: attention_merge(*_partial_twin(**i)),
                lambda **i: to_host(attention_merge_launch(*_partial_on_device(**i))), _cases, _CONTROLS,
                kernels=(attention_partial_kernel, attention_merge_kernel)),
]
