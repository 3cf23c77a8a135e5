"""Causal attention as partials over fixed chunks of keys, then a merge.

A query row reads logical keys 0 .. n - 1 of its stream: the stream's committed keys, then the keys of its own path
in the window (paths.py), n = committed + depth + 1. In the cache, logical key j < committed is row j, and logical
key committed + d is row committed + path_slots[r, d]: a window's rows are written at committed + slot, so a tree
row reads its ancestors' keys and its own, never a sibling's. A chain's path is the identity (row r's key at depth
d sits at slot d), and so is every key when no map is given (each row's keys all below its n).

The keys are cut into chunks at fixed logical positions, [0, CHUNK), [CHUNK, 2 CHUNK), ..., that depend only on n,
never on the other rows of the round or on where the keys sit in the cache: so a row's sums are the same whether it
runs alone or beside a long prompt, and a tree row's are those of the one-row step it stands for.

Per (row, query head, chunk) the partial computes

    s[key] = (q . k[key]) * scale          with the dot walked over head dims in order (fma_rn)
    m      = max s                         (exact in any order)
    p[key] = exp(s[key] - m)
    l      = sum p                          (a fixed tree over the chunk's slots; empty slots add 0)
    o[d]   = sum_key p[key] * v[key, d]    (keys walked in order, fma_rn)

and the merge combines a row's chunks in order: M = max m_c, w_c = exp(m_c - M), L = sum l_c w_c,
O = sum o_c w_c, out = O / L; in a gated attention layer, out = O / L * sigmoid(gate), the layer's output gate
(taken here, so that it costs no launch of its own).

Every multiply-add is `fma_rn`, rounded once to float32 (the GPU's `fma.rn.f32`, which the twin reproduces
exactly, fmath.py): the dots are chains of dependent multiply-adds, and `fma32`'s float64 round trip would make
each step of the chain several times longer.

Query head h reads KV head `h // (Hq / Hkv)` (grouped-query attention).

A chunk a row does not reach (its first key is past n) holds m = -inf, l = 0, o = 0, and the merge skips it; so
the partials of a round can hold as many chunks as its longest row needs.

A window's keys and values go into the cache with `kv_write`: row r to cache row at[r] (committed + slot), read from
device memory, so that a recorded decode round (graphs.py) writes where each replay's stream length says. Keeping a
tree path moves its rows from committed + slot to committed + depth (`kv_compact`), so that the stream's committed
keys sit in order again; a chain's kept rows are already there.

Mapping (the kernels): partial, one block of CHUNK threads per (row, query head, chunk). The block first puts the
row's query in shared memory (one load of each value, not one per key). Thread t owns key slot t: its score, then
its slot in a max tree and in a sum tree in shared memory (the halving order of `fmath.tree_sum`; an empty slot
holds -inf in the max tree and 0 in the sum tree). Then thread t owns head dims t and t + CHUNK (DIMS_A_THREAD) and
walks the chunk's keys in order for o, both dims at once. Both walks load LOADS values (of each dim) before they add
any (a walk that waits for each load in turn spends most of its time waiting). The arrays come in flat and every
index is unsigned, so a load costs no check for a negative index. Each thread finds a key's cache row with
`cache_row`. Keys past a row's n are never read (the twin reads cache row 0 for them and multiplies it by p = 0,
which gives the same bits while the cache holds finite values). Merge: one thread per (row, head, dim), walking the
chunks in order. The partial kernel takes the chunk width as an argument (CHUNK in the engine) so that the contract
can plant a moved chunk boundary. Write: one thread per element of the window's keys (and the same element of its
values). Compact: one thread per (KV head, dim), moving that element of each path row in increasing depth.
"""
import math

import numpy as np
from numba import cuda

from tensorfold.cuda.fmath import exp32, exp32_twin, fma_rn, sigmoid32, sigmoid32_twin, tree_sum
from tensorfold.device.grid import BLOCK, blocks_for, device_int32, flat
from tensorfold.device.launch import kernel
from tensorfold.numerics import paths
from tensorfold.numerics.floats import fma_rn_twin

CHUNK = 128  # keys per chunk: also the width of the partial's reduction tree
LOADS = 16  # keys (or head dims) a partial's thread loads before it adds any: their latencies overlap, where a loop
# that used each value as it loaded it would wait a memory latency per key
DIMS_A_THREAD = 2  # head dims a partial's thread owns for o: CHUNK * 2 = 256, Qwen3.5's head_dim
MAX_HEAD_DIM = DIMS_A_THREAD * CHUNK
HELD = DIMS_A_THREAD * LOADS  # values a partial's thread holds at a time (numba sizes a local array by a constant)


def cache_rows(logical, committed, path_slots):
    """[rows, keys]: the cache row of each row's logical keys (committed keys in place, then the row's path);
    `committed` one count for every row, or each row's."""
    committed = np.asarray(committed).reshape(-1, 1)
    in_window = np.clip(logical[None, :] - committed, 0, path_slots.shape[1] - 1)
    return np.where(logical[None, :] < committed, logical[None, :],
                    committed + np.take_along_axis(path_slots, in_window, axis=1))


def attention_partial(q, keys, values, n_keys, scale, committed=None, path_slots=None):
    """q [rows, Hq, hd]; keys, values [N, Hkv, hd], the cache. Row r reads logical keys 0 .. n_keys[r] - 1: key
    j < committed is cache row j, key committed + d is cache row committed + path_slots[r, d] (int [rows, deepest +
    1]; `committed` an int, or int [rows], each row's stream length); without them every key is read in place.

    Returns (m, l [rows, Hq, chunks], o [rows, Hq, chunks, hd]); chunks a row does not reach hold m = -inf, l = 0.
    """
    rows, heads, head_dim = q.shape
    kv_head = np.arange(heads) // (heads // keys.shape[1])  # query head h reads KV head h // share
    n_keys = np.asarray(n_keys)
    if path_slots is None:
        committed, path_slots = keys.shape[0], np.zeros((rows, 1), np.int32)
    chunks = -(-int(n_keys.max()) // CHUNK)
    m = np.full((rows, heads, chunks), -np.inf, np.float32)
    l = np.zeros((rows, heads, chunks), np.float32)
    o = np.zeros((rows, heads, chunks, head_dim), np.float32)
    for c in range(chunks):
        logical = np.arange(c * CHUNK, min((c + 1) * CHUNK, int(n_keys.max())))
        live = logical[None, :] < n_keys[:, None]  # [rows, slots]: the keys each row may read
        if not live.any():
            continue
        rows_read = np.where(live, cache_rows(logical, committed, path_slots), 0)  # [rows, slots]
        chunk_keys = keys[rows_read]  # [rows, slots, Hkv, hd]
        scores = np.zeros((rows, heads, len(logical)), np.float32)
        for d in range(head_dim):  # each slot's thread walks the head dims in order
            scores = fma_rn_twin(q[:, :, None, d], chunk_keys[:, :, kv_head, d].transpose(0, 2, 1), scores)
        scores = scores * np.float32(scale)
        scores = np.where(live[:, None, :], scores, -np.inf).astype(np.float32)
        chunk_max = scores.max(axis=2)
        reached = np.isfinite(chunk_max)
        safe_max = np.where(reached, chunk_max, 0).astype(np.float32)
        p = np.where(live[:, None, :], exp32_twin(scores - safe_max[:, :, None]), 0).astype(np.float32)
        tree = np.zeros((rows, heads, CHUNK), np.float32)
        tree[:, :, :len(logical)] = p
        m[:, :, c] = chunk_max
        l[:, :, c] = tree_sum(tree)
        acc = np.zeros((rows, heads, head_dim), np.float32)
        for s in range(len(logical)):  # each dim's thread walks the chunk's keys in order
            acc = fma_rn_twin(p[:, :, s, None], values[rows_read[:, s]][:, kv_head], acc)
        o[:, :, c] = acc
    return m, l, o


def attention_merge(m, l, o, gate=None):
    """Combine a row's chunk partials in chunk order: out [rows, Hq, hd] = sum_c o_c w_c / sum_c l_c w_c; with a
    gate [rows, Hq, hd] (a gated attention layer's output gate), that times sigmoid(gate), here so that the gate
    costs no launch of its own."""
    top = m.max(axis=2)
    total = np.zeros(l.shape[:2], np.float32)
    acc = np.zeros(o.shape[:2] + o.shape[3:], np.float32)
    for c in range(m.shape[2]):
        reached = np.isfinite(m[:, :, c])
        weight = np.where(reached, exp32_twin(np.where(reached, m[:, :, c] - top, 0)), 0).astype(np.float32)
        total = fma_rn_twin(l[:, :, c], weight, total)
        acc = fma_rn_twin(o[:, :, c], weight[:, :, None], acc)
    out = acc / total[:, :, None]
    return out if gate is None else out * sigmoid32_twin(gate)


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
# Partial: block (c, h, r) = chunk c of query head h of row r, CHUNK threads. Thread t owns logical key c * chunk + t
# for the score and its tree slot, then head dims t and t + CHUNK for o; `cache_row` says where each key sits. The
# chunk width is an argument (CHUNK in the engine; the shared arrays and the trees are always CHUNK wide, slots past
# the width stay empty).

@cuda.jit(device=True)
def cache_row(key, r, committed, path_slots):
    """The cache row of row r's logical key `key`: the committed keys in place, then the row's path."""
    if key < committed:
        return key
    return committed + path_slots[r, key - committed]


@kernel
def attention_partial_kernel(q, keys, values, heads, kv_heads, dims, n_keys, committed, path_slots, scale, chunk, m, l,
                             o):
    """q, keys, values flat (their rows [heads or kv_heads, dims] one after another); committed [rows], each row's
    stream length; indices are unsigned, so that a load costs no check for negative indices."""
    c, h, r, t = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z, cuda.threadIdx.x
    length = committed[r]  # row r's stream length, from device memory (a recorded round's change per replay)
    kv = h // (heads // kv_heads)  # grouped-query attention: the KV head this query head reads
    start = c * chunk
    live = min(start + chunk, n_keys[r]) - start  # keys of this chunk the row reads (<= 0: the chunk is unreached)
    scores = cuda.shared.array(CHUNK, np.float32)  # the score of each slot, then its p
    top = cuda.shared.array(CHUNK, np.float32)  # the max tree
    total = cuda.shared.array(CHUNK, np.float32)  # the sum tree
    query = cuda.shared.array(MAX_HEAD_DIM, np.float32)  # the row's query, loaded once for every slot's dot
    for d in range(t, dims, CHUNK):
        query[d] = q[np.uint64((r * heads + h) * dims + d)]
    cuda.syncthreads()
    score = np.float32(-np.inf)  # an empty slot: -inf to the max
    batch = cuda.local.array(HELD, np.float32)
    if t < live:
        key = np.uint64((cache_row(start + t, r, length, path_slots) * kv_heads + kv) * dims)  # its key's start
        acc = np.float32(0)
        for first in range(0, dims, LOADS):  # the dot over head dims in order, LOADS loads ahead of their use
            for u in range(LOADS):
                batch[u] = keys[key + np.uint64(min(first + u, dims - 1))]
            for u in range(LOADS):
                if first + u < dims:
                    acc = fma_rn(query[first + u], batch[u], acc)
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
    # Now thread t owns head dims t and t + CHUNK (DIMS_A_THREAD), and walks the chunk's keys in order for both at
    # once: twice the loads in flight of a walk dim by dim. Keys past n_keys[r] are never read.
    sums = cuda.local.array(DIMS_A_THREAD, np.float32)  # o of the thread's dims
    for j in range(DIMS_A_THREAD):
        sums[j] = 0
    for first in range(0, max(live, 0), LOADS):
        for u in range(LOADS):  # LOADS keys' values loaded ahead of their use (past the chunk's last: its last again)
            value_row = np.uint64((cache_row(start + min(first + u, live - 1), r, length, path_slots) * kv_heads
                                   + kv) * dims)  # where the key's values for this KV head start
            for j in range(DIMS_A_THREAD):
                batch[j * LOADS + u] = values[value_row + np.uint64(min(t + j * CHUNK, dims - 1))]
        for u in range(LOADS):
            if first + u < live:
                for j in range(DIMS_A_THREAD):
                    sums[j] = fma_rn(scores[first + u], batch[j * LOADS + u], sums[j])
    for j in range(DIMS_A_THREAD):
        if t + j * CHUNK < dims:
            o[r, h, c, t + j * CHUNK] = sums[j]


@kernel
def attention_merge_kernel(m, l, o, gate, gated, out):
    """Thread i owns dim d of head h of row r, i = (r * heads + h) * head_dim + d, and walks the chunks in order;
    with `gated`, it multiplies the result by sigmoid(gate[r, h, d])."""
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
                total = fma_rn(l[r, h, c], weight, total)
                acc = fma_rn(o[r, h, c, d], weight, acc)
        value = acc / total
        if gated:
            value = value * sigmoid32(gate[r, h, d])
        out[r, h, d] = value


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


def attention_partial_launch(q, keys, values, n_keys, scale, committed=None, path_slots=None, stream=0,
                             max_keys=None, chunk=CHUNK):
    """q [rows, Hq, hd], keys and values [N, Hkv, hd], n_keys [rows] and path_slots [rows, deepest + 1] (int32) on
    the device; committed an int, or each row's on the device (int32 [rows]: a recorded round reads it there).
    Returns (m, l, o). Without path_slots every key is read in place.

    The outputs hold ceil(max_keys / chunk) chunks, max_keys defaulting to N: pass the largest n_keys when the
    cache has room beyond it (chunks no row reaches only cost empty blocks, and the merge ignores them).
    """
    rows, heads, head_dim = q.shape
    if path_slots is None:  # every key in place (each row's keys are below its n_keys): the map is never read
        committed, path_slots = n_keys, cuda.device_array((rows, 1), np.int32, stream=stream)
    elif isinstance(committed, (int, np.integer)):
        committed = cuda.to_device(np.full(rows, committed, np.int32), stream=stream)
    chunks = -(-(keys.shape[0] if max_keys is None else max_keys) // chunk)
    m = cuda.device_array((rows, heads, chunks), np.float32, stream=stream)
    l = cuda.device_array((rows, heads, chunks), np.float32, stream=stream)
    o = cuda.device_array((rows, heads, chunks, head_dim), np.float32, stream=stream)
    assert head_dim <= DIMS_A_THREAD * CHUNK, f"head_dim {head_dim} over the partial's {DIMS_A_THREAD * CHUNK}"
    attention_partial_kernel[(chunks, heads, rows), CHUNK, stream](flat(q), flat(keys), flat(values), heads,
                                                                   keys.shape[1], head_dim, n_keys, committed,
                                                                   path_slots, scale, chunk, m, l, o)
    return m, l, o


def attention_merge_launch(m, l, o, out=None, gate=None, stream=0):
    """m, l [rows, Hq, chunks] and o [rows, Hq, chunks, hd] on the device, and the output gate [rows, Hq, hd] (any
    strides: a view of q_proj's output) or None; returns out [rows, Hq, hd] (a new array, or the one given)."""
    rows, heads, _, head_dim = o.shape
    out = cuda.device_array((rows, heads, head_dim), np.float32, stream=stream) if out is None else out
    attention_merge_kernel[blocks_for(out.size), BLOCK, stream](m, l, o, out if gate is None else gate,
                                                                gate is not None, out)
    return out


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
