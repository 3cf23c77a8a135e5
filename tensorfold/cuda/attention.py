"""Causal attention as partials over fixed chunks of keys, then a merge.

For a query row at position p, its keys are positions 0 .. n - 1 (n = p + 1 for a prompt row). The keys are cut
into chunks at fixed logical positions, [0, CHUNK), [CHUNK, 2 CHUNK), ..., that depend only on n, never on the
other rows of the round: so a row's sums are the same whether it runs alone or beside a long prompt.

Per (row, query head, chunk) the partial computes

    s[key] = (q . k[key]) * scale          with the dot walked over head dims in order (fma32)
    m      = max s                         (exact in any order)
    p[key] = exp(s[key] - m)
    l      = sum p                          (a fixed tree over the chunk's slots; empty slots add 0)
    o[d]   = sum_key p[key] * v[key, d]    (keys walked in order, fma32)

and the merge combines a row's chunks in order: M = max m_c, w_c = exp(m_c - M), L = sum l_c w_c,
O = sum o_c w_c, out = O / L.

Query head h reads KV head `h // (Hq / Hkv)` (grouped-query attention).

A chunk a row does not reach (its first key is past n) holds m = -inf, l = 0, o = 0, and the merge skips it; so
the partials of a round can hold as many chunks as its longest row needs.

Mapping (the kernels): partial, one block of CHUNK threads per (row, query head, chunk). Thread t owns key slot t:
its score, then its slot in a max tree and in a sum tree in shared memory (the halving order of `fmath.tree_sum`;
an empty slot holds -inf in the max tree and 0 in the sum tree). Then thread t owns head dims t, t + CHUNK, ...
and walks the chunk's keys in order for o. Keys past a row's n are never read (the twin multiplies them by p = 0,
which gives the same bits while the cache holds finite values). Merge: one thread per (row, head, dim), walking
the chunks in order. The partial kernel takes the chunk width as an argument (CHUNK in the engine) so that the
contract can plant a moved chunk boundary.
"""
import math

import numpy as np
from numba import cuda

from ..contract import KernelCheck
from .common import BLOCK, blocks_for, swap_rows, to_host
from .fmath import exp32, exp32_twin, fma32, tree_sum

CHUNK = 128  # keys per chunk: also the width of the partial's reduction tree


def attention_partial(q, keys, values, n_keys, scale):
    """q [rows, Hq, hd]; keys, values [N, Hkv, hd] (rows read keys 0 .. n_keys[r] - 1).

    Returns (m, l [rows, Hq, chunks], o [rows, Hq, chunks, hd]); chunks a row does not reach hold m = -inf, l = 0.
    """
    rows, heads, head_dim = q.shape
    share = heads // keys.shape[1]
    keys = np.repeat(keys, share, axis=1)  # [N, Hq, hd]: query head h reads KV head h // share
    values = np.repeat(values, share, axis=1)
    n_keys = np.asarray(n_keys)
    chunks = -(-int(n_keys.max()) // CHUNK)
    m = np.full((rows, heads, chunks), -np.inf, np.float32)
    l = np.zeros((rows, heads, chunks), np.float32)
    o = np.zeros((rows, heads, chunks, head_dim), np.float32)
    for c in range(chunks):
        slots = np.arange(c * CHUNK, min((c + 1) * CHUNK, keys.shape[0]))
        live = slots[None, :] < n_keys[:, None]  # [rows, slots]: the keys each row may read
        if not live.any():
            continue
        chunk_keys = keys[slots].transpose(1, 0, 2)  # [Hq, slots, hd]
        scores = np.zeros((rows, heads, len(slots)), np.float32)
        for d in range(head_dim):  # each slot's thread walks the head dims in order
            scores = fma32.py_func(q[:, :, None, d], chunk_keys[None, :, :, d], scores)
        scores = scores * np.float32(scale)
        scores = np.where(live[:, None, :], scores, -np.inf).astype(np.float32)
        chunk_max = scores.max(axis=2)
        reached = np.isfinite(chunk_max)
        safe_max = np.where(reached, chunk_max, 0).astype(np.float32)
        p = np.where(live[:, None, :], exp32_twin(scores - safe_max[:, :, None]), 0).astype(np.float32)
        tree = np.zeros((rows, heads, CHUNK), np.float32)
        tree[:, :, :len(slots)] = p
        m[:, :, c] = chunk_max
        l[:, :, c] = tree_sum(tree)
        acc = np.zeros((rows, heads, head_dim), np.float32)
        for s, slot in enumerate(slots):  # each dim's thread walks the chunk's keys in order
            acc = fma32.py_func(p[:, :, s, None], values[slot][None], acc)
        o[:, :, c] = acc
    return m, l, o


def attention_merge(m, l, o):
    """Combine a row's chunk partials in chunk order: out [rows, Hq, hd] = sum_c o_c w_c / sum_c l_c w_c."""
    top = m.max(axis=2)
    total = np.zeros(l.shape[:2], np.float32)
    acc = np.zeros(o.shape[:2] + o.shape[3:], np.float32)
    for c in range(m.shape[2]):
        reached = np.isfinite(m[:, :, c])
        weight = np.where(reached, exp32_twin(np.where(reached, m[:, :, c] - top, 0)), 0).astype(np.float32)
        total = fma32.py_func(l[:, :, c], weight, total)
        acc = fma32.py_func(o[:, :, c], weight[:, :, None], acc)
    return acc / total[:, :, None]


# --- the kernels --------------------------------------------------------------------------------------------------
# Partial: block (c, h, r) = chunk c of query head h of row r, CHUNK threads. Thread t owns key slot c * chunk + t
# for the score and its tree slot, then head dims t, t + CHUNK, ... for o. The chunk width is an argument (CHUNK
# in the engine; the shared arrays and the trees are always CHUNK wide, slots past the width stay empty).

@cuda.jit
def attention_partial_kernel(q, keys, values, n_keys, scale, chunk, m, l, o):
    c, h, r, t = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z, cuda.threadIdx.x
    kv = h // (q.shape[1] // keys.shape[1])  # grouped-query attention: the KV head this query head reads
    start = c * chunk
    live = min(start + chunk, n_keys[r]) - start  # keys of this chunk the row reads (<= 0: the chunk is unreached)
    scores = cuda.shared.array(CHUNK, np.float32)  # the score of each slot, then its p
    top = cuda.shared.array(CHUNK, np.float32)  # the max tree
    total = cuda.shared.array(CHUNK, np.float32)  # the sum tree
    score = np.float32(-np.inf)  # an empty slot: -inf to the max
    if t < live:
        acc = np.float32(0)
        for d in range(q.shape[2]):
            acc = fma32(q[r, h, d], keys[start + t, kv, d], acc)
        score = acc * np.float32(scale)
    scores[t] = score
    top[t] = score
    width = CHUNK // 2
    while width > 0:
        cuda.syncthreads()
        if t < width:
            top[t] = max(top[t], top[t + width])
        width //= 2
    cuda.syncthreads()
    chunk_max = top[0]
    safe_max = chunk_max if math.isfinite(chunk_max) else np.float32(0)
    p = np.float32(0)  # an empty slot: 0 to the sum
    if t < live:
        p = exp32(scores[t] - safe_max)  # the score read back from shared memory, so it is never fused into an fma
    scores[t] = p
    total[t] = p
    width = CHUNK // 2
    while width > 0:
        cuda.syncthreads()
        if t < width:
            total[t] += total[t + width]
        width //= 2
    cuda.syncthreads()
    if t == 0:
        m[r, h, c] = chunk_max
        l[r, h, c] = total[0]
    for d in range(t, q.shape[2], CHUNK):  # now thread t owns head dims t, t + CHUNK, ...
        acc = np.float32(0)
        for k in range(max(live, 0)):  # the chunk's keys in order; keys past n_keys[r] are never read
            acc = fma32(scores[k], values[start + k, kv, d], acc)
        o[r, h, c, d] = acc


@cuda.jit
def attention_merge_kernel(m, l, o, out):
    """Thread i owns dim d of head h of row r, i = (r * heads + h) * head_dim + d, and walks the chunks in order."""
    i = cuda.grid(1)
    heads, chunks, head_dim = o.shape[1], o.shape[2], o.shape[3]
    if i < o.shape[0] * heads * head_dim:
        r, h, d = i // (heads * head_dim), (i // head_dim) % heads, i % head_dim
        top = np.float32(-np.inf)
        for c in range(chunks):
            top = max(top, m[r, h, c])
        total = np.float32(0)
        acc = np.float32(0)
        for c in range(chunks):
            if math.isfinite(m[r, h, c]):  # a chunk the row does not reach adds nothing
                weight = exp32(m[r, h, c] - top)
                total = fma32(l[r, h, c], weight, total)
                acc = fma32(o[r, h, c, d], weight, acc)
        out[r, h, d] = acc / total


def attention_partial_launch(q, keys, values, n_keys, scale, stream=0, max_keys=None, chunk=CHUNK):
    """q [rows, Hq, hd], keys and values [N, Hkv, hd], n_keys [rows] (int) on the device; returns (m, l, o).

    The outputs hold ceil(max_keys / chunk) chunks, max_keys defaulting to N: pass the largest n_keys when the
    cache has room beyond it (chunks no row reaches only cost empty blocks, and the merge ignores them).
    """
    rows, heads, head_dim = q.shape
    chunks = -(-(keys.shape[0] if max_keys is None else max_keys) // chunk)
    m = cuda.device_array((rows, heads, chunks), np.float32, stream=stream)
    l = cuda.device_array((rows, heads, chunks), np.float32, stream=stream)
    o = cuda.device_array((rows, heads, chunks, head_dim), np.float32, stream=stream)
    attention_partial_kernel[(chunks, heads, rows), CHUNK, stream](q, keys, values, n_keys, scale, chunk, m, l, o)
    return m, l, o


def attention_merge_launch(m, l, o, stream=0):
    """m, l [rows, Hq, chunks] and o [rows, Hq, chunks, hd] on the device; returns out [rows, Hq, hd]."""
    rows, heads, _, head_dim = o.shape
    out = cuda.device_array((rows, heads, head_dim), np.float32, stream=stream)
    attention_merge_kernel[blocks_for(out.size), BLOCK, stream](m, l, o, out)
    return out


# --- the contract -------------------------------------------------------------------------------------------------

def _cases(mode, rng):
    """(rows, Hq, Hkv, hd, n_keys of the rows): the cache holds a few keys past the longest row (as a grown cache
    does), so that a kernel reading one key too many reads real data."""
    if mode == "sim":  # every partial block costs the simulator about half a second: a few blocks only
        shapes = [(2, 1, 1, 8, [130, 3]), (1, 2, 1, 8, [5])]
    else:
        mixed = [1, 4096, 127, 128, 129, 300, 1000, 2] + list(rng.integers(1, 4097, 8))
        shapes = [(16, 8, 2, 256, mixed), (1, 8, 2, 256, [1]), (1, 8, 2, 256, [127]), (1, 8, 2, 256, [128]),
                  (1, 8, 2, 256, [129]), (1, 8, 2, 256, [300]), (1, 8, 2, 256, [4096]),
                  (128, 8, 2, 256, list(range(873, 1001))),  # a prompt of 128 rows ending at position 999
                  (128, 8, 2, 256, [1] + list(rng.integers(1, 301, 127))),
                  (16, 16, 4, 256, mixed)]  # Qwen3.5-4B's heads
    cases = []
    for rows, heads, kv_heads, head_dim, n_keys in shapes:
        cache = max(n_keys) + 3
        cases.append((f"{rows}x{heads}/{kv_heads}x{head_dim} n<={max(n_keys)}", {
            "q": rng.normal(size=(rows, heads, head_dim)).astype(np.float32),
            "keys": rng.normal(size=(cache, kv_heads, head_dim)).astype(np.float32),
            "values": rng.normal(size=(cache, kv_heads, head_dim)).astype(np.float32),
            "n_keys": np.array(n_keys, np.int64), "scale": 1.0 / np.sqrt(head_dim), "chunk": CHUNK}))
    return cases


def _partial_twin(q, keys, values, n_keys, scale, chunk):
    return attention_partial(q, keys, values, n_keys, scale)  # the twin's chunk is always CHUNK


def _partial_on_device(q, keys, values, n_keys, scale, chunk):
    return attention_partial_launch(cuda.to_device(q), cuda.to_device(keys), cuda.to_device(values),
                                    cuda.to_device(np.asarray(n_keys, np.int32)), scale,
                                    max_keys=int(np.max(n_keys)), chunk=chunk)


def _merge_cases(mode, rng):
    return [(label, dict(zip("mlo", _partial_twin(**inputs)))) for label, inputs in _cases(mode, rng)
            if mode == "sim" or len(inputs["q"]) > 1]


def _reversed_chunks(inputs):
    """Planted: the merge walks the chunks last to first."""
    return {name: np.ascontiguousarray(np.flip(a, axis=2)) for name, a in inputs.items()}


_CONTROLS = {"a moved chunk boundary": lambda i: {**i, "chunk": 64},
             "n_keys off by one": lambda i: {**i, "n_keys": i["n_keys"] + 1},
             "two swapped rows": swap_rows("q")}
CONTRACT = [
    KernelCheck("attention_partial", _partial_twin, lambda **i: to_host(_partial_on_device(**i)), _cases, _CONTROLS),
    KernelCheck("attention_merge", attention_merge,
                lambda m, l, o: to_host(attention_merge_launch(cuda.to_device(m), cuda.to_device(l), cuda.to_device(o))),
                _merge_cases, {"two swapped rows": swap_rows("o"), "chunks merged in reverse": _reversed_chunks}),
    KernelCheck("attention", lambda **i: attention_merge(*_partial_twin(**i)),
                lambda **i: to_host(attention_merge_launch(*_partial_on_device(**i))), _cases, _CONTROLS),
]
