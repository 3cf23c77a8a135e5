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

Mapping (the kernels): partial, one block per (row, head, chunk) with one thread per key slot for the scores and
the tree, then one thread per head dim for o; merge, one thread per (row, head, dim).
"""
import numpy as np

from .fmath import exp32, fma32, tree_sum

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
        p = np.where(live[:, None, :], exp32.py_func(scores - safe_max[:, :, None]), 0).astype(np.float32)
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
        weight = np.where(reached, exp32.py_func(np.where(reached, m[:, :, c] - top, 0)), 0).astype(np.float32)
        total = fma32.py_func(l[:, :, c], weight, total)
        acc = fma32.py_func(o[:, :, c], weight[:, :, None], acc)
    return acc / total[:, :, None]
