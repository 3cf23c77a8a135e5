"""Gated DeltaNet: the recurrence of Qwen3.5's linear-attention layers, as a scan that logs each row and an apply
that replays logged rows into a state.

For each row and value head h, with the state S [dk, dv] (fp32), the head's shared key/query k, q [dk] (already
L2-normalised), its value v [dv], decay `a = exp(g)` and write strength `beta`:

    S     = a * S                        decay
    m[j]  = sum_i S[i, j] * k[i]         read
    d[j]  = (v[j] - m[j]) * beta         delta: what this row writes
    S     = S + outer(k, d)              write
    o[j]  = sum_i S[i, j] * q[i]         output, from the updated state

Every multiply-add above is `fma_rn`, rounded once to float32 (the GPU's `fma.rn.f32`, which the twin reproduces
exactly, fmath.py). Each sum over i runs as SUM_CHAINS interleaved chains (chain c takes i = c, c + SUM_CHAINS, ...
in order), added at the end in a fixed tree of neighbours, ((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7)): a sum
is a chain of dependent multiply-adds, each waiting for the one before, and eight chains an eighth as long, each on a
thread of its own, wait an eighth as long where one chain would wait on every result.

The scan logs each row's (decay, delta, key). Replaying the log with `deltanet_apply` (decay, then write) rebuilds
the scan's states bit for bit, which is how a stream keeps the rows of a window it accepted.

The rows of a window are a chain or a tree (`paths`): row r starts from the state after its parent, the row before
it in a chain. A tree row whose parent is not the row before it gets its parent's state rebuilt: the start state
with the logged rows of its path replayed root first (decay, then write, as `deltanet_apply` does), which are the
parent's state bit for bit. A chain never rebuilds, so it pays nothing for trees.

Value head h reads query/key head `h // (nv / nk)`: consecutive value heads share one key head.

Mapping (the scan): SUM_CHAINS threads per (value head h, column j), one per chain: thread c holds the elements i = c,
c + SUM_CHAINS, ... of column j of S (the ones its chain sums, in a local array) from the first row to the last and
walks them in order for both sums. The column's threads are neighbouring lanes of one warp: they trade their chains by
shuffles and each adds the SUM_CHAINS in the twin's tree (`chains_total`; `column_total`), so every sum has one fixed
order and all SUM_CHAINS hold the same total. No thread ever touches another column's state, so a rebuild reads only
deltas its own column logged, and each of the column's threads logs the delta (the same bits) so that it reads back its
own write. The scan's block, columns of one head, walks the rows in tiles of ROWS_STAGED: it stages a tile's keys and
queries, and its rows' v, decay, beta and parent, in shared memory at once (two barriers a tile), loaded while the tile
before runs; the tile's rows then run in order, each as the twin's row, every warp at its own pace (no barrier inside a
tile). The scan also writes the log: each row's delta column, and (from one block of the head, its blocks taking turns
row by row, so that none runs the others' share) its decay and its key, the shared key head repeated for every value
head that reads it.

Mapping (the apply): it has no sum, so every element S[h, i, j] is a chain of its own (decay, then write, per kept
row: `S[h, i, j] * decay[h]`, then `+ key[h, i] * delta[h, j]`, one fma): one thread per element, which reads it,
runs the path's rows in order and writes it back. It gets the path as an int32 array of row indices.

The scan's inputs come out of the layer's conv output and gate projections in one launch (`scan_inputs`): q and k
L2-normalised per head, v as it is, and each row's gates. Mapping: a block of rmsnorm.THREADS threads per (row,
slot): a slot per query head and per key head (the norm's tree, as rmsnorm.py has it), and a last slot that copies
the row's v and computes its gates, one thread per value head, so the gates take no launch of their own.
"""
import numpy as np
from numba import cuda

from tensorfold.cuda import (
    rmsnorm,  # its THREADS read through the module when a launch is sized: tests patch it
)
from tensorfold.cuda.fmath import exp32, exp32_twin, fma_rn, sigmoid32, sigmoid32_twin, softplus32, softplus32_twin
from tensorfold.cuda.ptx import FULL_WARP, shfl_xor
from tensorfold.cuda.rmsnorm import LOADS as NORM_LOADS
from tensorfold.cuda.rmsnorm import block_inverse_rms, l2norm, load_window, thread_squares
from tensorfold.device.grid import BLOCK, blocks_for, device_int32
from tensorfold.device.launch import kernel
from tensorfold.numerics import paths
from tensorfold.numerics.floats import fma_rn_twin


def deltanet_gates(b, a, a_log, dt_bias):
    """Per row and value head: (decay = exp(-exp(A_log) * softplus(a + dt_bias)), beta = sigmoid(b)), float32."""
    g = (-exp32_twin(a_log) * softplus32_twin(np.asarray(a, np.float32) + dt_bias)).astype(np.float32)
    return exp32_twin(g), sigmoid32_twin(b)


def scan_inputs(conv, b, a, a_log, dt_bias, heads, dk, eps, q_scale):
    """Everything the scan reads, out of the conv output [rows, C] (q | k | v, each head-major) and the gate
    projections b, a [rows, nv]: q [rows, heads, dk] L2-normalised per head and times q_scale, k [rows, heads, dk]
    normalised, v [rows, C - 2 heads dk] as it is, and (decay, beta) [rows, nv] (`deltanet_gates`)."""
    conv = np.asarray(conv, np.float32)
    rows, width = conv.shape[0], heads * dk
    q = l2norm(conv[:, :width].reshape(rows, heads, dk), eps, q_scale)
    k = l2norm(conv[:, width:2 * width].reshape(rows, heads, dk), eps)
    return (q, k, np.ascontiguousarray(conv[:, 2 * width:]), *deltanet_gates(b, a, a_log, dt_bias))


SUM_CHAINS = 8  # the chains a sum over the key dimension runs as (a power of two: the adding tree halves them)


def chains_total(chains):
    """A sum's chains added in the fixed tree of neighbours, ((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7)),
    float32, on arrays (the scan kernel's `column_total` adds the same tree by warp shuffles)."""
    level = list(chains)
    while len(level) > 1:
        level = [level[n] + level[n + 1] for n in range(0, len(level), 2)]
    return level[0]


def _column_sum(state, vec):
    """m[h, j] = sum_i state[h, i, j] * vec[h, i] (one thread per (h, j)): chain c walks i = c, c + SUM_CHAINS, ...
    in order, then `chains_total`."""
    chains = np.zeros((SUM_CHAINS, state.shape[0], state.shape[2]), np.float32)
    for i in range(state.shape[1]):
        chains[i % SUM_CHAINS] = fma_rn_twin(state[:, i, :], vec[:, i, None], chains[i % SUM_CHAINS])
    return chains_total(chains)


def _decay_and_write(state, decay, key, delta):
    """S = decay * S, then S = S + outer(key, delta): the two state updates of one row."""
    state = state * decay[:, None, None]
    return fma_rn_twin(key[:, :, None], delta[:, None, :], state)


def deltanet_scan(state, q, k, v, decay, beta, depths=None, path_slots=None):
    """Run the rows of a window from `state` [nv, dk, dv]: a chain, or the tree `depths`, `path_slots` describe.

    q, k [rows, nk, dk]; v [rows, nv, dv]; decay, beta [rows, nv]; depths [rows] and path_slots [rows, deepest + 1]
    int (by default a chain's). Returns (out [rows, nv, dv], the state after the last row, log) where log =
    (decay [rows, nv], delta [rows, nv, dv], key [rows, nv, dk]).
    """
    if depths is None:
        depths, path_slots = paths.depths(paths.chain(len(q))), paths.path_slots(paths.chain(len(q)))
    nv = state.shape[0]
    share = nv // q.shape[1]  # value heads per key head
    q = np.repeat(np.asarray(q, np.float32), share, axis=1)
    k = np.repeat(np.asarray(k, np.float32), share, axis=1)
    rows = q.shape[0]
    out = np.empty((rows, nv, state.shape[2]), np.float32)
    deltas = np.empty_like(out)
    start = np.array(state, np.float32, copy=True)
    state = start
    for r in range(rows):
        depth = depths[r]
        parent = path_slots[r, depth - 1] if depth > 0 else -1
        if parent != r - 1:  # a tree row that does not follow the row before it: rebuild its parent's state
            state = start
            for d in range(depth):  # its path's logged rows, root first
                ancestor = path_slots[r, d]
                state = _decay_and_write(state, decay[ancestor], k[ancestor], deltas[ancestor])
        decayed = state * decay[r][:, None, None]
        read = _column_sum(decayed, k[r])
        deltas[r] = (v[r] - read) * beta[r][:, None]
        state = fma_rn_twin(k[r][:, :, None], deltas[r][:, None, :], decayed)
        out[r] = _column_sum(state, q[r])
    return out, state, (np.array(decay, np.float32), deltas, k)


def deltanet_scan_lanes(pool, lanes, q, k, v, decay, beta):
    """One row for each window w from pool[lanes[w]] (pool [lanes, nv, dk, dv]): each window's row alone, as
    `deltanet_scan`, its state written back into a copy of the pool. Returns (out [windows, nv, dv], the pool after,
    log) with every window's log rows in window order."""
    pool, out, logs = np.array(pool, np.float32, copy=True), [], []
    for w, lane in enumerate(np.asarray(lanes)):
        rows, pool[lane], log = deltanet_scan(pool[lane], q[w:w + 1], k[w:w + 1], v[w:w + 1], decay[w:w + 1],
                                              beta[w:w + 1])
        out.append(rows)
        logs.append(log)
    return np.concatenate(out), pool, tuple(np.concatenate(part) for part in zip(*logs))


def deltanet_apply(state, log, path):
    """Replay the logged rows `path` (in order, up to its first negative entry) into `state` [nv, dk, dv]: decay,
    then write, as the scan did."""
    decay, delta, key = log
    state = np.array(state, np.float32, copy=True)
    for r in paths.until_end(path):
        state = _decay_and_write(state, decay[r], key[r], delta[r])
    return state


# --- the kernels --------------------------------------------------------------------------------------------------
# scan_inputs and the apply: see the module's docstring. The scan: SUM_CHAINS threads per (value head h, column j) of a
# grid over [nv, dv]; thread c of a column keeps the column's elements of its chain (i = c, c + SUM_CHAINS, ...) in
# `col`, a local array, from the first row to the last, and nothing else ever touches them. With an eighth of the column
# a thread, the multiply-adds a row runs one after another are an eighth as many, and the scan has as many warps as a
# head's columns times SUM_CHAINS: enough to give most multiprocessors a block. The scan's blocks hold columns of one
# head, which share the rows' keys and queries: the block walks the window in tiles of ROWS_STAGED rows and stages a
# whole tile's keys and queries in shared memory at once, beside the tile's values of its columns and its rows' decays,
# betas and parents. Within a tile the rows run one after another, each with the same operations in the same order as
# the twin's row: a tile changes when the inputs are loaded, never what is computed from them.

COLUMNS = 16  # columns per block of the scan (each sum in one fixed order, so the bits do not depend on it)
SCAN_THREADS = COLUMNS * SUM_CHAINS  # a thread per column and chain: consecutive threads are one column's chains
ROWS_STAGED = 8  # rows per scan tile; a thread holds its share of the next tile in registers while a tile runs
# a window of one row's depths and path slots: constants of the kernel that scans one row of many lanes
ONE_ROW_DEPTHS, ONE_ROW_SLOTS = paths.depths(paths.chain(1)), paths.path_slots(paths.chain(1))


@kernel
def scan_inputs_kernel(conv, b, a, a_log, dt_bias, heads, eps, q_scale, q, k, v, decay, beta):
    """Block (row r, slot): slots 0 .. heads - 1 normalise row r's query heads, the next `heads` its key heads,
    the last copies its v and computes its gates. q and k come as [rows * heads, dk]."""
    slots, t, threads = 2 * heads + 1, cuda.threadIdx.x, cuda.blockDim.x  # rmsnorm.THREADS threads
    r, slot = cuda.blockIdx.x // slots, cuda.blockIdx.x % slots
    dk = q.shape[1]
    if slot < 2 * heads:  # the same for the whole block: its barriers are reached by every thread or by none
        inv = block_inverse_rms(thread_squares(conv, r, slot * dk, dk, t), t, dk, eps, False)
        batch = cuda.local.array(NORM_LOADS, np.float32)
        for first in range(t, dk, threads * NORM_LOADS):
            load_window(conv, r, slot * dk, dk, first, batch)
            for u in range(NORM_LOADS):
                i = first + u * threads
                if i < dk:
                    if slot < heads:
                        q[r * heads + slot, i] = batch[u] * inv * np.float32(q_scale)
                    else:
                        k[r * heads + slot - heads, i] = batch[u] * inv * np.float32(1.0)
    else:
        for i in range(t, v.shape[1], threads):
            v[r, i] = conv[r, 2 * heads * dk + i]
        for h in range(t, b.shape[1], threads):  # the gates of value head h
            g = -exp32(a_log[h]) * softplus32(a[r, h] + dt_bias[h])
            decay[r, h] = exp32(g)
            beta[r, h] = sigmoid32(b[r, h])


def scan_inputs_launch(conv, b, a, a_log, dt_bias, heads, dk, eps, q_scale, stream=0):
    """scan_inputs on the device: (q, k) [rows, heads, dk], v [rows, C - 2 heads dk] and (decay, beta) [rows, nv],
    new arrays, one launch."""
    rows = conv.shape[0]
    q = cuda.device_array((rows * heads, dk), np.float32, stream=stream)
    k = cuda.device_array((rows * heads, dk), np.float32, stream=stream)
    v = cuda.device_array((rows, conv.shape[1] - 2 * heads * dk), np.float32, stream=stream)
    decay = cuda.device_array(b.shape, np.float32, stream=stream)
    beta = cuda.device_array(b.shape, np.float32, stream=stream)
    scan_inputs_kernel[rows * (2 * heads + 1), rmsnorm.THREADS, stream](conv, b, a, a_log, dt_bias, heads, eps,
                                                                        q_scale, q, k, v, decay, beta)
    return q.reshape(rows, heads, dk), k.reshape(rows, heads, dk), v, decay, beta


def scan_kernel(dk, lanes=False):
    """The scan kernel for key heads of dk (a constant of the closure, so the loops over a chain's elements have a
    fixed count and `col`, `keys` and `queries` fixed sizes). A block is COLUMNS columns of one value head
    (blockIdx.y), SUM_CHAINS threads a column. The rows go a tile of ROWS_STAGED at a time: the block stages the
    tile's keys and queries, which every column of the head reads, in shared memory together (`store_tile`), so the
    two sums read them there instead of each thread loading them from global memory, and the tile's barriers come
    once a tile instead of once a row. With `lanes`, the kernel of `deltanet_scan_lanes_launch`: blockIdx.z is a
    window of one row, whose state is its lane's row of a pool, written over it (`scan_window` is the same).

    A thread reads its chain of the state and of a logged key through a view (`state[h, c::SUM_CHAINS, j]`), and the
    staged keys and queries by chain (`keys[u, c, m]`), so that in the unrolled loops each element is at a fixed
    offset from one address; it writes its column's deltas and outputs through views too (`log_delta[:, h, j]`), each
    row's address one multiply-add from the view's. Each thread loads the next tile's inputs into its registers before
    the rows of this tile run, and stores them in shared memory after them (`load_tile`, `store_tile`), so that their
    loads wait on memory while the rows run, not between tiles."""
    per_chain = -(-dk // SUM_CHAINS)  # the elements of a column that one chain (one thread) holds
    whole = dk % SUM_CHAINS == 0  # every chain holds per_chain elements: the compiler drops the `m < ...` tests
    staged_per_thread = -(-ROWS_STAGED * dk // SCAN_THREADS)  # a tile's key (and query) values each thread stages
    values_per_thread = ROWS_STAGED * COLUMNS // SCAN_THREADS  # and its values
    loaded_per_thread = 2 * staged_per_thread + values_per_thread + 2  # and a row's decay and beta
    # A tile row's keys (and queries) by chain, each chain 4 floats further along the 32 banks than the one before
    # (with per_chain a multiple of 8): one column's chains read different banks, and four of a chain's elements are one
    # 16-byte load.
    chain_pitch = per_chain + 4

    @cuda.jit(device=True)
    def load_chain(start, col, chain_length):
        """col[m] = start[m]: the thread's chain of a column of the state the window starts from."""
        for m in range(per_chain):
            if whole or m < chain_length:
                col[m] = start[m]

    @cuda.jit(device=True)
    def load_tile(k, q, v, decay, beta, depths, g, h, row0, rows, first_column, first_row, loaded, loaded_depth):
        """This thread's share of a tile's inputs, for the window's rows r = first_row + u, loaded into its registers
        and not yet used: in `loaded`, every SCAN_THREADS-th value of the tile's keys [u, n] = k[row0 + r, g, n] (rows
        past the window's last not loaded: no row reads them), then of its queries, then of its values [u, column] =
        v[row0 + r, h, first_column + column]; thread u < ROWS_STAGED also its row's decay and beta (last in
        `loaded`) and depth (`loaded_depth[0]`). Issued before a tile's rows run, they arrive while those rows run."""
        dv, t = v.shape[2], cuda.threadIdx.x
        for step in range(staged_per_thread):
            place = step * SCAN_THREADS + t  # in the tile, row by row
            if place < ROWS_STAGED * dk and first_row + place // dk < rows:
                r, n = row0 + first_row + place // dk, place % dk
                loaded[step], loaded[staged_per_thread + step] = k[r, g, n], q[r, g, n]
        for step in range(values_per_thread):
            place = step * SCAN_THREADS + t
            u, column = place // COLUMNS, place % COLUMNS
            r = row0 + min(first_row + u, rows - 1)
            loaded[2 * staged_per_thread + step] = v[r, h, min(first_column + column, dv - 1)]
        if t < ROWS_STAGED:
            r = min(first_row + t, rows - 1)
            loaded[loaded_per_thread - 2], loaded[loaded_per_thread - 1] = decay[row0 + r, h], beta[row0 + r, h]
            loaded_depth[0] = depths[r]

    @cuda.jit(device=True)
    def store_tile(loaded, loaded_depth, path_slots, rows, first_row, keys, queries, values, decays, betas, parents):
        """Store what `load_tile` loaded in the block's shared tile: keys[u, c, m] (element c + m SUM_CHAINS of the
        row's key: each row's elements by chain) and queries the same, values[u, column], and decays[u], betas[u] and
        parents[u] (-1 for a root). A row with as many ancestors as rows before it follows the row before it (a
        window's rows come after their parents), so a chain's rows need no load of their path here."""
        t = cuda.threadIdx.x
        for step in range(staged_per_thread):
            place = step * SCAN_THREADS + t
            if place < ROWS_STAGED * dk and first_row + place // dk < rows:
                u, n = place // dk, place % dk
                keys[u, n % SUM_CHAINS, n // SUM_CHAINS] = loaded[step]
                queries[u, n % SUM_CHAINS, n // SUM_CHAINS] = loaded[staged_per_thread + step]
        for step in range(values_per_thread):
            place = step * SCAN_THREADS + t
            values[place // COLUMNS, place % COLUMNS] = loaded[2 * staged_per_thread + step]
        if t < ROWS_STAGED:
            r, depth = min(first_row + t, rows - 1), loaded_depth[0]
            decays[t], betas[t] = loaded[loaded_per_thread - 2], loaded[loaded_per_thread - 1]
            parents[t] = r - 1 if depth == r else (path_slots[r, depth - 1] if depth > 0 else -1)

    @cuda.jit(device=True)
    def column_total(chain):
        """The column's sum, in every one of its SUM_CHAINS threads (lanes 8k .. 8k + 7 of a warp) by three
        shuffles: each level adds a lane's partial sum and its neighbour's, partner lane ^ 1, then ^ 2, then ^ 4,
        which is the twin's tree in every lane (a lane whose partner's half comes first adds the same two values
        the other way round, the same bits: a float addition is commutative). The warp's columns need no other
        warp's: no barrier."""
        pair = chain + shfl_xor(chain, 1, FULL_WARP)
        quad = pair + shfl_xor(pair, 2, FULL_WARP)
        return quad + shfl_xor(quad, 4, FULL_WARP)

    @cuda.jit(device=True)
    def scan_window(states, new_states, lane, row0, rows, q, k, v, decay, beta, depths, path_slots, out, log_decay,
                    log_delta, log_key):
        """The block's columns of one window: rows row0 .. row0 + rows - 1 of the round's arrays, from the state
        states[lane] to new_states[lane] (which may be the same array). Rows and lanes are offsets, not views of the
        arrays: views of the window's rows cost the compiler registers (a block a multiprocessor fewer), where a
        thread's views of one column (one stride) cost it none."""
        h, t = cuda.blockIdx.y, cuda.threadIdx.x
        column, c = t // SUM_CHAINS, t % SUM_CHAINS  # the thread's column in the block and its chain
        nv, dv = states.shape[1], states.shape[3]
        j = min(cuda.blockIdx.x * COLUMNS + column, dv - 1)  # a thread past the last column runs the last, unwritten
        live = cuda.blockIdx.x * COLUMNS + column < dv
        g = h // (nv // q.shape[1])  # the query/key head that value head h reads
        chain_length = -(-(dk - c) // SUM_CHAINS)  # per_chain, or one less for the last chains when dk is not whole
        col = cuda.local.array(per_chain, np.float32)  # column j's elements c, c + SUM_CHAINS, ...
        keys = cuda.shared.array((ROWS_STAGED, SUM_CHAINS, chain_pitch), np.float32)  # the tile's, by chain
        queries = cuda.shared.array((ROWS_STAGED, SUM_CHAINS, chain_pitch), np.float32)
        values = cuda.shared.array((ROWS_STAGED, COLUMNS), np.float32)  # the tile's v of the block's columns
        decays = cuda.shared.array(ROWS_STAGED, np.float32)  # and its rows' gates and parents
        betas = cuda.shared.array(ROWS_STAGED, np.float32)
        parents = cuda.shared.array(ROWS_STAGED, np.int32)
        start = states[lane, h, c::SUM_CHAINS, j]  # the chain's elements of the column, in the state it starts from
        load_chain(start, col, chain_length)
        loaded = cuda.local.array(loaded_per_thread, np.float32)  # the next tile's inputs, on their way
        loaded_depth = cuda.local.array(1, np.int32)
        first_column = cuda.blockIdx.x * COLUMNS
        deltas_of_column, outputs_of_column = log_delta[:, h, j], out[:, h, j]
        logger = row0 % cuda.gridDim.x  # the block of the head that logs this row's decay and key: they take turns
        load_tile(k, q, v, decay, beta, depths, g, h, row0, rows, first_column, 0, loaded, loaded_depth)
        for first_row in range(0, rows, ROWS_STAGED):  # the same tiles and rows in every thread: all reach each barrier
            cuda.syncthreads()  # every thread is done with the last tile
            store_tile(loaded, loaded_depth, path_slots, rows, first_row, keys, queries, values, decays, betas, parents)
            cuda.syncthreads()
            if first_row + ROWS_STAGED < rows:  # the next tile's loads, in flight while this tile's rows run
                load_tile(k, q, v, decay, beta, depths, g, h, row0, rows, first_column, first_row + ROWS_STAGED,
                          loaded, loaded_depth)
            for u in range(min(ROWS_STAGED, rows - first_row)):
                r = first_row + u
                if parents[u] != r - 1:  # a tree row that does not follow the row before: rebuild its parent's state
                    load_chain(start, col, chain_length)
                    for d in range(depths[r]):  # its path's logged rows, root first: decay, then write
                        ancestor = row0 + path_slots[r, d]  # its delta logged by this thread, maybe earlier
                        ancestor_key = k[ancestor, g, c::SUM_CHAINS]
                        delta, a = deltas_of_column[ancestor], decay[ancestor, h]
                        for m in range(per_chain):
                            if whole or m < chain_length:
                                col[m] = fma_rn(ancestor_key[m], delta, col[m] * a)
                a = decays[u]
                chain = np.float32(0)
                for m in range(per_chain):  # decay, then read: this thread's chain of m[j] = sum_i S[i, j] * k[i]
                    if whole or m < chain_length:
                        col[m] = col[m] * a
                        chain = fma_rn(col[m], keys[u, c, m], chain)
                delta = (values[u, column] - column_total(chain)) * betas[u]
                chain = np.float32(0)
                for m in range(per_chain):  # write, then output: its chain of o[j] = sum_i S[i, j] * q[i], updated
                    if whole or m < chain_length:
                        col[m] = fma_rn(keys[u, c, m], delta, col[m])
                        chain = fma_rn(col[m], queries[u, c, m], chain)
                o = column_total(chain)
                if live:
                    deltas_of_column[row0 + r] = delta  # at once, by each chain's thread: a later rebuild reads it
                    if c == 0:
                        outputs_of_column[row0 + r] = o
                if cuda.blockIdx.x == logger:
                    if t == 0:
                        log_decay[row0 + r, h] = a
                    for n in range(t, dk, SCAN_THREADS):  # the head's key, which every block of the head staged
                        log_key[row0 + r, h, n] = keys[u, n % SUM_CHAINS, n // SUM_CHAINS]
                # the next row's logger, counted: a remainder every row would cost every thread dozens of instructions
                logger = logger + 1 if logger + 1 < cuda.gridDim.x else 0
        if live:
            end = new_states[lane, h, c::SUM_CHAINS, j]
            for m in range(per_chain):
                if whole or m < chain_length:
                    end[m] = col[m]

    @kernel
    def deltanet_scan_kernel(states, q, k, v, decay, beta, depths, path_slots, out, new_states, log_decay, log_delta,
                             log_key):
        scan_window(states, new_states, 0, 0, q.shape[0], q, k, v, decay, beta, depths, path_slots, out, log_decay,
                    log_delta, log_key)

    @kernel
    def deltanet_scan_lanes_kernel(pool, new_pool, lanes, q, k, v, decay, beta, out, log_decay, log_delta, log_key):
        w = cuda.blockIdx.z  # window w: row w of the round, from its lane's state and written over it
        depths, path_slots = cuda.const.array_like(ONE_ROW_DEPTHS), cuda.const.array_like(ONE_ROW_SLOTS)
        scan_window(pool, new_pool, lanes[w], w, 1, q, k, v, decay, beta, depths, path_slots, out, log_decay,
                    log_delta, log_key)

    return deltanet_scan_lanes_kernel if lanes else deltanet_scan_kernel


scan_kernels = {}  # dk (and "lanes") -> its scan kernel, compiled on first use


def deltanet_scan_launch(state, q, k, v, decay, beta, depths=None, path_slots=None, in_place=False, out=None,
                         stream=0):
    """Run the rows from `state` [nv, dk, dv] on the device; returns (out, new state, (decay, delta, key)); `out`,
    if given, is the [rows, nv, dv] array the rows are written to.

    depths and path_slots are int32 device arrays (None: a chain's, uploaded here). The new state is a new array,
    or `state` itself when `in_place` (each thread reads its elements, and rereads them for a rebuild, before it
    writes them at the end, and no other thread touches them).
    """
    nv, dk, dv = state.shape
    rows = q.shape[0]
    assert nv % q.shape[1] == 0, "value heads must be a multiple of key heads"
    if depths is None:
        depths = cuda.to_device(paths.depths(paths.chain(rows)), stream=stream)
        path_slots = cuda.to_device(paths.path_slots(paths.chain(rows)), stream=stream)
    out = cuda.device_array((rows, nv, dv), np.float32, stream=stream) if out is None else out
    new_state = state if in_place else cuda.device_array((nv, dk, dv), np.float32, stream=stream)
    log = (cuda.device_array((rows, nv), np.float32, stream=stream),
           cuda.device_array((rows, nv, dv), np.float32, stream=stream),
           cuda.device_array((rows, nv, dk), np.float32, stream=stream))
    if dk not in scan_kernels:
        scan_kernels[dk] = scan_kernel(dk)
    states, new_states = state.reshape(1, nv, dk, dv), new_state.reshape(1, nv, dk, dv)  # lane 0 of one-lane pools
    scan_kernels[dk][(-(-dv // COLUMNS), nv), SCAN_THREADS, stream](states, q, k, v, decay, beta, depths, path_slots,
                                                                     out, new_states, *log)
    return out, new_state, log


def deltanet_scan_lanes_launch(pool, lanes, q, k, v, decay, beta, out, stream=0):
    """Window w's one row from pool[lanes[w]] [nv, dk, dv], written over it, for every window in one launch: row w
    of `out` and the log (decay, delta, key) of every row, as `deltanet_scan_launch` of each window alone."""
    windows, (nv, dk, dv) = q.shape[0], pool.shape[1:]
    assert nv % q.shape[1] == 0 and lanes.shape[0] == windows, "one row a window, value heads a multiple of keys"
    log = (cuda.device_array((windows, nv), np.float32, stream=stream),
           cuda.device_array((windows, nv, dv), np.float32, stream=stream),
           cuda.device_array((windows, nv, dk), np.float32, stream=stream))
    if (dk, "lanes") not in scan_kernels:
        scan_kernels[dk, "lanes"] = scan_kernel(dk, lanes=True)
    # The pool goes in twice, as the states read and the states written: told they are one array, the compiler would
    # keep more of them in registers (a block a multiprocessor fewer).
    scan_kernels[dk, "lanes"][(-(-dv // COLUMNS), nv, windows), SCAN_THREADS, stream](
        pool, pool, lanes, q, k, v, decay, beta, out, *log)
    return log


@kernel
def deltanet_apply_kernel(state, log_decay, log_delta, log_key, path, new_state):
    i = cuda.grid(1)
    nv, dk, dv = state.shape[0], state.shape[1], state.shape[2]
    h, n, j = i // (dk * dv), i // dv % dk, i % dv  # j fastest: a warp reads and writes consecutive elements
    if h < nv:
        s = state[h, n, j]
        for p in range(path.shape[0]):
            r = path[p]
            if r < 0:  # the path's end
                break
            s = fma_rn(log_key[r, h, n], log_delta[r, h, j], s * log_decay[r, h])  # decay, then write
        new_state[h, n, j] = s


def deltanet_apply_launch(state, log, path, in_place=False, stream=0):
    """Replay the logged rows `path` into `state` on the device: a host list of row indices (uploaded as int32), or
    int32 on the device, ended by its first negative entry (a recorded keep's). `in_place`: over `state` (each
    thread reads the one element it writes)."""
    nv, dk, dv = state.shape
    rows = device_int32(path, stream)
    new_state = state if in_place else cuda.device_array((nv, dk, dv), np.float32, stream=stream)
    deltanet_apply_kernel[blocks_for(nv * dk * dv), BLOCK, stream](state, *log, rows, new_state)
    return new_state
