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

A window's keys and values go into the cache at committed + slot, and a kept tree path's rows move down to
committed + depth (kv.py).

Mapping (the kernels): partial, one block of CHUNK threads per (row, query head, chunk). The block first puts the
row's query in shared memory (one load of each value, not one per key). Thread t owns key slot t: its score, then
its slot in a max tree and in a sum tree in shared memory (the halving order of `fmath.tree_sum`; an empty slot
holds -inf in the max tree and 0 in the sum tree). Then thread t owns head dims t and t + CHUNK (DIMS_A_THREAD) and
walks the chunk's keys in order for o, both dims at once. Both walks load LOADS values (of each dim) before they add
any (a walk that waits for each load in turn spends most of its time waiting). The arrays come in flat and every
index is unsigned, so a load costs no check for a negative index. Each thread finds a key's cache row with
`cache_row`. Keys past a row's n are never read (the twin reads cache row 0 for them and multiplies it by p = 0,
which gives the same bits while the cache holds finite values).

Partial over a tile of rows: the per-row blocks of a prompt chunk or of a drafted chain would each load their
chunk's keys and values again, so when the rows read their keys in place, one block of CHUNK threads serves (chunk,
query head, a tile of consecutive rows) and loads each key and value once for all of them: PROMPT_ROWS_A_BLOCK rows
in a prompt chunk, ROUND_ROWS_A_BLOCK in a round's window, whose few rows would otherwise fill a block or two a
chunk and head (a block's work is serial in its rows). A call takes it when more than half a round's window reads
its keys in place, or when its grid (chunks x heads x tiles) still gives every multiprocessor two blocks (a long
cache); a few rows over a short cache run faster on the per-row kernel's many blocks, which a tree's rows (reading
their path's keys) always take. The block stages the tile's queries and the chunk's keys in shared memory a piece of
DIMS_A_PIECE head dims at a time, the pieces in order; thread t owns key slot t and adds each dim of its key into
its dot with every row's query, so each (row, key) dot walks the head dims in order, as in the per-row kernel. Each
row has its own max tree and sum tree with the per-row kernel's halving steps (a step of all the tile's rows spread
over the threads). Then thread t owns head dims t and t + CHUNK of every row, walks the chunk's keys in order, loads
each key's value once and adds it into the o of each row that reads that key. The tile loads the keys of its longest
row; a shorter row's dots past its n are computed but dropped (-inf, p = 0) and its sums skip those keys, so each
row's m, l and o are the per-row kernel's, bit for bit. A tile that reaches no key of the chunk writes its rows'
empty partials (m = -inf, l = 0, o = 0) and loads nothing.

Merge: one thread per (row, head, dim), walking the chunks in order. Both partial kernels take the chunk width as an
argument (CHUNK in the engine) so that the contract can plant a moved chunk boundary.
"""
import functools
import math

import numpy as np
from numba import cuda

from tensorfold.cuda.fmath import exp32, exp32_twin, fma_rn, sigmoid32, sigmoid32_twin, tree_sum
from tensorfold.device.grid import BLOCK, blocks_for, flat, multiprocessors
from tensorfold.device.launch import kernel
from tensorfold.numerics.floats import fma_rn_twin

CHUNK = 128  # keys per chunk: also the width of the partial's reduction tree
LOADS = 16  # keys (or head dims) a partial's thread loads before it adds any: their memory latencies overlap
DIMS_A_THREAD = 2  # head dims a partial's thread owns for o: CHUNK * 2 = 256, Qwen3.5's head_dim
MAX_HEAD_DIM = DIMS_A_THREAD * CHUNK
HELD = DIMS_A_THREAD * LOADS  # values a partial's thread holds at a time (numba sizes a local array by a constant)
PROMPT_ROWS_A_BLOCK = 16  # query rows a block of the tile kernel serves in a prompt chunk: each key and value it
# loads is used by all of them
ROUND_ROWS_A_BLOCK = 4  # and in a call of at most ROUND_ROWS rows (`tile_rows`)
ROUND_ROWS = 16  # rows of a round's window at most (a drafted chain)
DIMS_A_PIECE = 32  # head dims of the tile's queries and of the chunk's keys in shared memory at a time
PIECES_A_PASS = CHUNK // DIMS_A_PIECE  # keys (or query rows) whose piece the block's threads stage side by side
PIECE_ROW = DIMS_A_PIECE + 1  # a staged key's row in shared memory: one column more than its piece, so that the
# CHUNK threads reading one dim of their keys read different banks
KEYS_A_THREAD = CHUNK // PIECES_A_PASS  # key values a thread stages for each piece


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
    kv_heads = keys.shape[1]
    share = heads // kv_heads
    # Query head h = kv * share + i reads KV head kv: with the heads grouped so, each KV head's keys and values are
    # gathered once a chunk and broadcast over its query heads.
    q_by_kv = q.reshape(rows, kv_heads, share, head_dim)
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
        keys_by_dim = keys.transpose(2, 1, 0)[:, :, rows_read]  # [hd, Hkv, rows, slots]: each row's keys
        scores = np.zeros((rows, kv_heads, share, len(logical)), np.float32)
        for d in range(head_dim):  # each slot's thread walks the head dims in order
            scores = fma_rn_twin(q_by_kv[:, :, :, d, None], keys_by_dim[d].transpose(1, 0, 2)[:, :, None, :], scores)
        del keys_by_dim  # a prompt chunk's are large: freed before its values are gathered
        scores = scores.reshape(rows, heads, len(logical)) * np.float32(scale)
        scores = np.where(live[:, None, :], scores, -np.inf).astype(np.float32)
        chunk_max = scores.max(axis=2)
        reached = np.isfinite(chunk_max)
        safe_max = np.where(reached, chunk_max, 0).astype(np.float32)
        p = np.where(live[:, None, :], exp32_twin(scores - safe_max[:, :, None]), 0).astype(np.float32)
        tree = np.zeros((rows, heads, CHUNK), np.float32)
        tree[:, :, :len(logical)] = p
        m[:, :, c] = chunk_max
        l[:, :, c] = tree_sum(tree)
        chunk_values = values[rows_read]  # [rows, slots, Hkv, hd]
        p_by_kv = p.reshape(rows, kv_heads, share, len(logical))
        acc = np.zeros((rows, kv_heads, share, head_dim), np.float32)
        for s in range(len(logical)):  # each dim's thread walks the chunk's keys in order
            acc = fma_rn_twin(p_by_kv[:, :, :, s, None], chunk_values[:, s, :, None, :], acc)
        o[:, :, c] = acc.reshape(rows, heads, head_dim)
    return m, l, o


def attention_merge(m, l, o, q_and_gate=None):
    """Combine a row's chunk partials in chunk order: out [rows, Hq, hd] = sum_c o_c w_c / sum_c l_c w_c; with
    q_and_gate [rows, Hq, 2 hd] (a gated attention layer's q_proj output: per head the query, then the output gate),
    that times sigmoid(gate), here so that the gate costs no launch of its own."""
    top = m.max(axis=2)
    total = np.zeros(l.shape[:2], np.float32)
    acc = np.zeros(o.shape[:2] + o.shape[3:], np.float32)
    for c in range(m.shape[2]):
        reached = np.isfinite(m[:, :, c])
        weight = np.where(reached, exp32_twin(np.where(reached, m[:, :, c] - top, 0)), 0).astype(np.float32)
        total = fma_rn_twin(l[:, :, c], weight, total)
        acc = fma_rn_twin(o[:, :, c], weight[:, :, None], acc)
    out = acc / total[:, :, None]
    return out if q_and_gate is None else out * sigmoid32_twin(q_and_gate[:, :, o.shape[3]:])


# --- the kernels --------------------------------------------------------------------------------------------------
# Partial: block (c, h, r) = chunk c of query head h of row r, CHUNK threads. Thread t owns logical key c * chunk + t
# for the score and its tree slot, then head dims t and t + CHUNK for o; `cache_row` says where each key sits. The
# chunk width is an argument (CHUNK in the engine; the shared arrays and the trees are always CHUNK wide, slots past
# the width stay empty).
# Partial over a tile: block (c, h, g) = chunk c of query head h of rows g * rows_a_block onward (keys in place:
# logical key j is cache row j), CHUNK threads. Thread t owns key slot t for the dots of all the tile's rows and its
# slot in each row's trees, then head dims t and t + CHUNK of every row for o.

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


@functools.cache
def attention_partial_tile_kernel(rows_a_block):
    """The partial over tiles of `rows_a_block` rows (`tile_rows`): q, keys, values flat, as for
    attention_partial_kernel; every row reads its keys in place (logical key j is cache row j). Block (c, h, g)
    serves the tile of rows g * rows_a_block onward."""
    queries_a_thread = rows_a_block // PIECES_A_PASS  # query values a thread stages for each piece
    sums_a_thread = rows_a_block * DIMS_A_THREAD  # o values a thread sums: its dims of every row

    @kernel
    def partial_tile(q, keys, values, heads, kv_heads, dims, n_keys, scale, chunk, m, l, o):
        c, h, t = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
        first_row = cuda.blockIdx.z * rows_a_block
        tile_rows = min(rows_a_block, m.shape[0] - first_row)  # rows of the tile in the call; the others do nothing
        kv = h // (heads // kv_heads)
        start = c * chunk
        lives = cuda.local.array(rows_a_block, np.int64)  # keys of this chunk each row of the tile reads (<= 0: none)
        tile_live = 0  # keys of this chunk the tile loads: those of its longest row
        for i in range(rows_a_block):
            lives[i] = min(start + chunk, n_keys[first_row + i]) - start if i < tile_rows else 0
            tile_live = max(tile_live, lives[i])
        if tile_live <= 0:  # no row of the tile reaches this chunk (the same for every thread: none waits at a barrier)
            for i in range(tile_rows):
                if t == 0:
                    m[first_row + i, h, c] = -np.inf
                    l[first_row + i, h, c] = 0
                for d in range(t, dims, CHUNK):
                    o[first_row + i, h, c, d] = 0
            return
        queries = cuda.shared.array((DIMS_A_PIECE, rows_a_block), np.float32)  # a piece of dims of the tile's queries
        key_piece = cuda.shared.array((CHUNK, PIECE_ROW), np.float32)  # the same dims of the chunk's keys
        scores = cuda.shared.array((rows_a_block, CHUNK), np.float32)  # each row's score of each slot, then its p
        tree = cuda.shared.array((rows_a_block, CHUNK), np.float32)  # each row's max tree, then its sum tree
        staged_queries = cuda.local.array(queries_a_thread, np.float32)  # what this thread stages, all loaded before
        staged_keys = cuda.local.array(KEYS_A_THREAD, np.float32)  # any is stored
        dots = cuda.local.array(rows_a_block, np.float32)  # slot t's key with each row's query
        for i in range(rows_a_block):
            dots[i] = 0
        d = t % DIMS_A_PIECE  # the dim of each piece this thread stages: consecutive threads, consecutive dims of a row
        for first in range(0, dims, DIMS_A_PIECE):  # the pieces in order, so that each dot walks the dims in order
            dim = min(first + d, dims - 1)  # past the head's last dim: that one again, which no dot reads
            for k in range(queries_a_thread):  # past the call's last row: that row again, whose dots are never kept
                row = first_row + min(t // DIMS_A_PIECE + k * PIECES_A_PASS, tile_rows - 1)
                staged_queries[k] = q[np.uint64((row * heads + h) * dims + dim)]
            for k in range(KEYS_A_THREAD):  # past the tile's last key: that key again, in a slot no thread reads
                key_row = start + min(t // DIMS_A_PIECE + k * PIECES_A_PASS, tile_live - 1)
                staged_keys[k] = keys[np.uint64((key_row * kv_heads + kv) * dims + dim)]
            cuda.syncthreads()  # every thread is done with the last piece
            for k in range(queries_a_thread):
                queries[d, t // DIMS_A_PIECE + k * PIECES_A_PASS] = staged_queries[k]
            for k in range(KEYS_A_THREAD):
                key_piece[t // DIMS_A_PIECE + k * PIECES_A_PASS, d] = staged_keys[k]
            cuda.syncthreads()
            if t < tile_live:
                for n in range(min(DIMS_A_PIECE, dims - first)):
                    key_value = key_piece[t, n]  # read once, used for every row's dot
                    for i in range(rows_a_block):
                        dots[i] = fma_rn(queries[n, i], key_value, dots[i])
        for i in range(rows_a_block):
            score = np.float32(-np.inf)  # an empty slot (past the row's n: its dot is dropped): -inf to the max
            if t < lives[i]:
                score = dots[i] * np.float32(scale)
            scores[i, t] = score
            tree[i, t] = score
        width = CHUNK // 2
        while width > 0:  # every row's max tree, one step of all rows at a time
            cuda.syncthreads()
            for pair in range(t, rows_a_block * width, CHUNK):
                i, slot = pair // width, pair % width
                tree[i, slot] = max(tree[i, slot], tree[i, slot + width])
            width //= 2
        cuda.syncthreads()
        maxima = cuda.local.array(rows_a_block, np.float32)  # each row's chunk max
        for i in range(rows_a_block):
            maxima[i] = tree[i, 0]
        cuda.syncthreads()  # every thread has read the maxima before the tree takes the p
        for i in range(rows_a_block):
            safe_max = maxima[i] if math.isfinite(maxima[i]) else np.float32(0)
            p = np.float32(0)  # an empty slot: 0 to the sum
            if t < lives[i]:
                p = exp32(scores[i, t] - safe_max)  # the score read back from shared memory: never fused into an fma
            scores[i, t] = p
            tree[i, t] = p
        width = CHUNK // 2
        while width > 0:  # every row's sum tree, in the halving order of tree_sum
            cuda.syncthreads()
            for pair in range(t, rows_a_block * width, CHUNK):
                i, slot = pair // width, pair % width
                tree[i, slot] += tree[i, slot + width]
            width //= 2
        cuda.syncthreads()
        for i in range(rows_a_block):  # every row, then a test: a local array stays in registers only where each index
            if t == 0 and i < tile_rows:  # is a constant of an unrolled loop
                m[first_row + i, h, c] = maxima[i]
                l[first_row + i, h, c] = tree[i, 0]
        if t >= dims:  # a thread past the head's dims owns none (no barrier follows)
            return
        # Now thread t owns head dims t and t + CHUNK of every row of the tile and walks the chunk's keys in order: it
        # loads each value once and adds it to the o of each row that reads that key.
        sums = cuda.local.array(sums_a_thread, np.float32)  # o of the thread's dims, row after row
        for j in range(sums_a_thread):
            sums[j] = 0
        batch = cuda.local.array(HELD, np.float32)
        for first in range(0, tile_live, LOADS):
            for u in range(LOADS):  # LOADS keys' values loaded ahead of their use (past the tile's last key: it again)
                value_row = np.uint64(((start + min(first + u, tile_live - 1)) * kv_heads + kv) * dims)
                for j in range(DIMS_A_THREAD):
                    batch[j * LOADS + u] = values[value_row + np.uint64(min(t + j * CHUNK, dims - 1))]
            for u in range(LOADS):
                for i in range(rows_a_block):
                    if first + u < lives[i]:  # row i adds its own keys only, as the per-row kernel does
                        for j in range(DIMS_A_THREAD):
                            sums[i * DIMS_A_THREAD + j] = fma_rn(scores[i, first + u], batch[j * LOADS + u],
                                                                 sums[i * DIMS_A_THREAD + j])
        for i in range(rows_a_block):
            for j in range(DIMS_A_THREAD):
                if i < tile_rows and t + j * CHUNK < dims:
                    o[first_row + i, h, c, t + j * CHUNK] = sums[i * DIMS_A_THREAD + j]

    return partial_tile

@kernel
def attention_merge_kernel(m, l, o, q_and_gate, gated, out):
    """Thread i owns dim d of head h of row r, i = (r * heads + h) * head_dim + d, and walks the chunks in order;
    with `gated`, it multiplies the result by sigmoid(gate), the gate at q_and_gate[r, h, head_dim + d]."""
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
            value = value * sigmoid32(q_and_gate[r, h, head_dim + d])
        out[r, h, d] = value


def tile_rows(rows):
    """Rows a block of the tile kernel serves in a call of `rows` rows: a round's window (at most ROUND_ROWS) in
    tiles of ROUND_ROWS_A_BLOCK, so that its few rows still fill several blocks a chunk and head (a block walks its
    rows in turn); a prompt chunk in tiles of PROMPT_ROWS_A_BLOCK, each key loaded once for more rows."""
    return ROUND_ROWS_A_BLOCK if rows <= ROUND_ROWS else PROMPT_ROWS_A_BLOCK


def attention_partial_launch(q, keys, values, n_keys, scale, committed=None, path_slots=None, stream=0,
                             max_keys=None, chunk=CHUNK, tile=None):
    """q [rows, Hq, hd], keys and values [N, Hkv, hd], n_keys [rows] and path_slots [rows, deepest + 1] (int32) on
    the device; committed an int, or each row's on the device (int32 [rows]: a recorded round reads it there).
    Returns (m, l, o). Without path_slots every key is read in place, and more than one row may run the tile kernel
    (`tile`: on, off, or None for the module's rule); the others run the per-row kernel. Both give the twin's bits.

    The outputs hold ceil(max_keys / chunk) chunks, max_keys defaulting to N: pass the largest n_keys when the
    cache has room beyond it (chunks no row reaches only cost empty blocks, and the merge ignores them).
    """
    rows, heads, head_dim = q.shape
    chunks = -(-(keys.shape[0] if max_keys is None else max_keys) // chunk)
    m = cuda.device_array((rows, heads, chunks), np.float32, stream=stream)
    l = cuda.device_array((rows, heads, chunks), np.float32, stream=stream)
    o = cuda.device_array((rows, heads, chunks, head_dim), np.float32, stream=stream)
    assert head_dim <= DIMS_A_THREAD * CHUNK, f"head_dim {head_dim} over the partial's {DIMS_A_THREAD * CHUNK}"
    rows_a_block = tile_rows(rows)
    tiles = -(-rows // rows_a_block)
    if tile is None:  # most of a round's window, or a grid that fills the GPU (the module's docstring)
        tile = rows > ROUND_ROWS // 2 or (rows > 1 and chunks * heads * tiles >= 2 * multiprocessors())
    if path_slots is None and tile:  # rows that read their keys in place: each chunk's keys loaded once a tile
        attention_partial_tile_kernel(rows_a_block)[(chunks, heads, tiles), CHUNK, stream](
            flat(q), flat(keys), flat(values), heads, keys.shape[1], head_dim, n_keys, scale, chunk, m, l, o)
        return m, l, o
    if path_slots is None:  # every key in place (each row's keys are below its n_keys): the map is never read
        committed, path_slots = n_keys, cuda.device_array((rows, 1), np.int32, stream=stream)
    elif isinstance(committed, (int, np.integer)):
        committed = cuda.to_device(np.full(rows, committed, np.int32), stream=stream)
    attention_partial_kernel[(chunks, heads, rows), CHUNK, stream](flat(q), flat(keys), flat(values), heads,
                                                                   keys.shape[1], head_dim, n_keys, committed,
                                                                   path_slots, scale, chunk, m, l, o)
    return m, l, o


def attention_merge_launch(m, l, o, out=None, q_and_gate=None, stream=0):
    """m, l [rows, Hq, chunks], o [rows, Hq, chunks, hd] and q_proj's output [rows, Hq, 2 hd] (or None) on the device
    (a strided view of the gate alone would cost the host a walk over every row and head to slice); returns out."""
    rows, heads, _, head_dim = o.shape
    out = cuda.device_array((rows, heads, head_dim), np.float32, stream=stream) if out is None else out
    attention_merge_kernel[blocks_for(out.size), BLOCK, stream](m, l, o, out if q_and_gate is None else q_and_gate,
                                                                q_and_gate is not None, out)
    return out
