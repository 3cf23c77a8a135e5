"""The Qwen3.5 hybrid forward pass over one round's rows, built from the kernel families through a backend.

Every layer is pre-norm residual: `h += mixer(norm(h))`, `h += mlp(norm(h))`, where the mixer is a Gated DeltaNet
layer or a gated full-attention layer (config.layer_types).

A round runs the windows of several streams at once. A window is a chain of rows that continues one stream: a
prompt chunk, one decode row, or a drafted chain. Row-wise work (projections, norms, the MLP, the head) runs
once over every row of the round; the work that reads a stream's history (the conv, the DeltaNet scan, RoPE
positions, attention) runs window by window against that stream's cache. Every op's arithmetic for one row is
independent of the rows beside it, so a row computes the same bits in a prompt pass, in a one-row step, or beside
another stream's window.

A forward leaves each stream's cache as it was and records what the window would add; `StreamState.keep(n)` then
commits the first n rows (all of them for a prompt chunk or a decode row, the accepted prefix of a drafted chain):
the DeltaNet state replays the scan's log for those rows, the conv tail moves along them, the key/value rows past
them are left to be overwritten.
"""
import dataclasses
import math

import numpy as np

from .config import ModelConfig

L2NORM_EPS = 1e-6  # DeltaNet's query/key L2 norm uses a fixed eps, not rms_norm_eps


@dataclasses.dataclass
class DeltaNetRecord:
    """What one window did to one DeltaNet layer, kept until the stream keeps some of its rows."""
    before: object  # the state the scan started from
    after: object  # the state after every row of the window
    log: tuple  # (decay, delta, key) per row: replaying rows 0..n-1 gives the state after row n-1
    inputs: object  # the raw conv inputs of the window's rows
    tail: object  # the conv tail the window started from
    new_tail: object  # the conv tail after every row (chains)
    states: list | None = None  # trees: the state after each row, each row having started from its parent's


@dataclasses.dataclass(frozen=True)
class KeepPolicy:
    """The deferred keep. With `late`, the DeltaNet rows a stream keeps from a drafted window are not applied to
    its state at once: they wait in the stream's pending buffer, and the next scan, which loads the state anyway,
    replays them first. The state is written back at a one-row window, at a prompt chunk, when `threshold` rows
    are pending, or when a kept path does not fit in the `capacity` left. Replaying uses the scan's own fp32 steps
    in the same order, so every output keeps its bits; on a GPU it saves a state write per drafted round."""
    late: bool = True
    threshold: int = 24
    capacity: int = 48


def pending_row_bytes(config: ModelConfig) -> int:
    """Bytes one pending row takes: the decay, delta and key of every value head of every DeltaNet layer."""
    c = config
    return 4 * c.layer_types.count("linear_attention") * c.linear_num_value_heads * (
        1 + c.linear_value_head_dim + c.linear_key_head_dim)


class StreamState:
    """One stream's cache: its committed length, and per layer the DeltaNet state, conv tail and pending rows, or
    the attention keys and values (post-norm, post-RoPE; buffers that grow, of which rows [0, length) are
    committed)."""

    def __init__(self, config: ModelConfig, ops, max_rows: int | None = None, policy: KeepPolicy = KeepPolicy()):
        c = self.config = config
        self.ops, self.policy = ops, policy
        self.max_rows = max_rows  # key/value buffers never grow past this (the engine's context), if set
        self.length = 0
        self.window_rows = 0  # rows of the last forward not yet kept or dropped
        self.pending_rows = 0  # kept DeltaNet rows not yet applied to `recurrent` (the same count in every layer)
        self.pending = {}  # layer -> (decay, delta, key) of the pending rows, in path order
        self.recurrent, self.conv_tail, self.keys, self.values, self.records = {}, {}, {}, {}, {}
        self.tree_kv = {}  # attention layer -> (keys, values) of the last tree window's rows
        for i, kind in enumerate(c.layer_types):
            if kind == "linear_attention":
                self.recurrent[i] = ops.zeros((c.linear_num_value_heads, c.linear_key_head_dim,
                                               c.linear_value_head_dim))
                self.conv_tail[i] = ops.zeros((c.linear_conv_kernel_dim - 1, c.conv_dim))
            else:
                self.keys[i] = ops.zeros((0, c.num_key_value_heads, c.head_dim))
                self.values[i] = ops.zeros((0, c.num_key_value_heads, c.head_dim))

    @property
    def nbytes(self) -> int:
        """Bytes of the cache, counting the pending buffer at its full capacity."""
        parts = [*self.recurrent.values(), *self.conv_tail.values(), *self.keys.values(), *self.values.values()]
        pending = self.policy.capacity * pending_row_bytes(self.config) if self.policy.late else 0
        return sum(a.nbytes for a in parts) + pending

    def scan_start(self, i):
        """The state layer i's next scan starts from: the stored state with the pending rows replayed."""
        if not self.pending_rows:
            return self.recurrent[i]
        return self.ops.deltanet_apply(self.recurrent[i], self.pending[i], range(self.pending_rows))

    def land(self) -> None:
        """Apply the pending rows to the stored states (before a snapshot, or when the buffer is full enough)."""
        if self.pending_rows:
            for i in self.recurrent:
                self.recurrent[i] = self.scan_start(i)
            self.pending_rows, self.pending = 0, {}

    def _pend(self, i, rows) -> None:
        """Append kept log rows (decay, delta, key) to layer i's pending buffer."""
        self.pending[i] = rows if not self.pending_rows else tuple(
            self.ops.concat_rows([old, new]) for old, new in zip(self.pending[i], rows))

    def _committed(self, n: int, deferred: bool) -> None:
        """After a keep of n rows: the pending count, the length, and a landing at the threshold."""
        if n and self.records:
            self.pending_rows = self.pending_rows + n if deferred else 0
            if not deferred:
                self.pending = {}
        self.length += n
        self.window_rows = 0
        self.records, self.tree_kv = {}, {}
        if self.pending_rows >= self.policy.threshold:
            self.land()

    def keep_path(self, path: list) -> None:
        """Commit a tree window's rows along `path` (the root, then each kept row a child of the one before)."""
        n = len(path)
        assert self.window_rows and all(r < self.window_rows for r in path), "keep a path of the last tree window"
        p, ops = self.policy, self.ops
        defer = p.late and self.window_rows > 1 and self.pending_rows + n <= p.capacity
        for i, record in self.records.items():
            if n == 0:
                continue
            if defer:
                self._pend(i, tuple(ops.concat_rows([part[r:r + 1] for r in path]) for part in record.log))
            else:
                self.recurrent[i] = record.states[path[-1]]  # the same updates, in path order, as a replay
            self.conv_tail[i] = ops.concat_rows([record.tail] + [record.inputs[r:r + 1] for r in path])[n:]
        for i, (k, v) in self.tree_kv.items():  # compact: the path's rows to length + depth
            for depth, r in enumerate(path):
                self.keys[i] = ops.append_rows(self.keys[i], self.length + depth, k[r:r + 1], self.max_rows)
                self.values[i] = ops.append_rows(self.values[i], self.length + depth, v[r:r + 1], self.max_rows)
        self._committed(n, defer)

    def keep(self, n: int, write_back: bool = False) -> None:
        """Commit the first n rows of the last (chain) window (0 <= n <= its rows). Their DeltaNet rows go to the
        pending buffer under a late policy, unless `write_back` (a prompt chunk), the window had one row, or they do
        not fit; then the state is written at once."""
        assert 0 <= n <= self.window_rows, f"cannot keep {n} of {self.window_rows} window rows"
        p = self.policy
        defer = p.late and not write_back and self.window_rows > 1 and self.pending_rows + n <= p.capacity
        for i, record in self.records.items():
            if n == 0:
                continue
            if defer:
                self._pend(i, tuple(part[:n] for part in record.log))
            elif n == self.window_rows:
                self.recurrent[i] = record.after  # record.before already had the pending rows replayed
            else:
                self.recurrent[i] = self.ops.deltanet_apply(record.before, record.log, range(n))
            self.conv_tail[i] = record.new_tail if n == self.window_rows else self.ops.concat_rows(
                [record.tail, record.inputs[:n]])[n:]
        self._committed(n, defer)


@dataclasses.dataclass
class Window:
    """One stream's rows in a round: `ids` continue `state`; logits for "all" rows or the "last".

    Without `parents` the rows are a chain (row r follows row r - 1). With them they are a tree: `parents[r]` is the
    row that row r follows (-1 for row 0, the root, which follows the stream), always an earlier row. A tree row
    sits at position length + its depth, and sees the stream and its own ancestors, never its siblings."""
    state: StreamState
    ids: list
    logits_for: str = "all"
    parents: list | None = None
    features: list | None = None  # after a forward with taps: each tapped layer's output at the window's rows

    @property
    def depths(self) -> list:
        if self.parents is None:
            return list(range(len(self.ids)))
        depths = []
        for r, parent in enumerate(self.parents):
            assert (r == 0) == (parent == -1) and parent < r, f"row {r}: parent {parent} must be an earlier row"
            depths.append(0 if parent < 0 else depths[parent] + 1)
        return depths

    @property
    def positions(self) -> np.ndarray:
        return self.state.length + np.asarray(self.depths)

    def ancestors(self, r: int) -> list:
        """Row r's ancestors in the window, nearest first."""
        chain = []
        while self.parents[r] >= 0:
            r = self.parents[r]
            chain.append(r)
        return chain


class Qwen35:
    """The text model: config, weights (by canonical name, on the backend) and the backend that runs its ops."""

    def __init__(self, config: ModelConfig, weights: dict, backend):
        self.config, self.ops = config, backend
        self.weights = {name: backend.upload(w) for name, w in weights.items()}
        self.lm_head = self.weights.get("lm_head.weight", self.weights["embed_tokens.weight"])

    def new_state(self, max_rows: int | None = None, policy: KeepPolicy = KeepPolicy()) -> StreamState:
        return StreamState(self.config, self.ops, max_rows, policy)

    def forward(self, ids, state: StreamState, logits_for="all"):
        """One window on its own, kept whole and written back: the logits of `ids` continuing `state`."""
        logits = self.forward_round([Window(state, list(ids), logits_for)])[0]
        state.keep(len(ids), write_back=True)
        return logits

    def forward_round(self, windows: list, taps: tuple = ()) -> list:
        """Run every window of a round in one pass; returns each window's logits. Nothing is kept yet.

        `taps` names layers whose outputs (the residual stream after the layer, before the final norm) a block
        drafter reads: each window's `features` gets them, one [rows, hidden] array per tapped layer."""
        c, w, ops = self.config, self.weights, self.ops
        bounds = np.cumsum([0] + [len(win.ids) for win in windows])
        spans = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
        for win in windows:
            assert win.ids and win.state.window_rows == 0, "a stream runs one non-empty window per round"
            win.state.window_rows = len(win.ids)
        h = ops.embed(np.concatenate([np.asarray(win.ids) for win in windows]), w["embed_tokens.weight"])
        tapped = {}
        for i, kind in enumerate(c.layer_types):
            p = f"layers.{i}."
            x = ops.rmsnorm(h, w[p + "input_layernorm.weight"], c.rms_norm_eps)
            mixer = self.deltanet if kind == "linear_attention" else self.attention
            h = ops.add(h, mixer(x, windows, spans, i))
            x = ops.rmsnorm(h, w[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
            h = ops.add(h, self.mlp(x, p + "mlp."))
            if i in taps:
                tapped[i] = h
        for win, (a, b) in zip(windows, spans):
            win.features = [tapped[i][a:b] for i in taps] if taps else None
        wanted = [(a, b) if win.logits_for == "all" else (b - 1, b) for win, (a, b) in zip(windows, spans)]
        rows = ops.concat_rows([h[a:b] for a, b in wanted]) if len(windows) > 1 else h[wanted[0][0]:wanted[0][1]]
        logits = ops.linear(ops.rmsnorm(rows, w["norm.weight"], c.rms_norm_eps), self.lm_head)
        counts = np.cumsum([0] + [b - a for a, b in wanted])
        return [logits[int(a):int(b)] for a, b in zip(counts[:-1], counts[1:])]

    def mlp(self, x, p):
        ops, w = self.ops, self.weights
        gate = ops.linear(x, w[p + "gate_proj.weight"])
        up = ops.linear(x, w[p + "up_proj.weight"])
        return ops.linear(ops.silu_mul(gate, up), w[p + "down_proj.weight"])

    def deltanet(self, x, windows, spans, i):
        """A Gated DeltaNet layer: projections, causal conv, L2-normed q/k, gated delta rule, gated norm, out."""
        c, ops, w = self.config, self.ops, self.weights
        p = f"layers.{i}.linear_attn."
        rows, nv, dv = x.shape[0], c.linear_num_value_heads, c.linear_value_head_dim
        mixed = ops.linear(x, w[p + "in_proj_qkv.weight"])  # [rows, C]: q | k | v, each head-major
        z = ops.linear(x, w[p + "in_proj_z.weight"]).reshape(rows, nv, dv)
        decay, beta = ops.deltanet_gates(ops.linear(x, w[p + "in_proj_b.weight"]),
                                         ops.linear(x, w[p + "in_proj_a.weight"]), w[p + "A_log"], w[p + "dt_bias"])
        outs = []
        for win, (a, b) in zip(windows, spans):  # the conv and the scan read the stream's own history
            state = win.state
            start = state.scan_start(i)  # the pending rows of the deferred keep, replayed first
            if win.parents is None:
                out, after, log, new_tail = self.deltanet_rows(mixed[a:b], state.conv_tail[i], start, decay[a:b],
                                                               beta[a:b], i)
                state.records[i] = DeltaNetRecord(start, after, log, mixed[a:b], state.conv_tail[i], new_tail)
            else:
                out, log, states = self.deltanet_tree(win, mixed[a:b], start, decay[a:b], beta[a:b], i)
                state.records[i] = DeltaNetRecord(start, None, log, mixed[a:b], state.conv_tail[i], None, states)
            outs.append(out)
        out = ops.concat_rows(outs) if len(outs) > 1 else outs[0]
        y = ops.rmsnorm_gated(out, z, w[p + "norm.weight"], c.rms_norm_eps)
        return ops.linear(y.reshape(rows, nv * dv), w[p + "out_proj.weight"])

    def deltanet_rows(self, mixed, tail, start, decay, beta, i):
        """A chain of rows through the conv and the scan: (out, state after the last row, log, new conv tail)."""
        c, ops, w = self.config, self.ops, self.weights
        nk, nv, dk, dv = c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
        n = mixed.shape[0]
        conv, new_tail = ops.causal_conv(mixed, tail, w[f"layers.{i}.linear_attn.conv1d.weight"])
        q = ops.l2norm(ops.take_last(conv, 0, nk * dk).reshape(n, nk, dk), L2NORM_EPS, scale=1.0 / math.sqrt(dk))
        k = ops.l2norm(ops.take_last(conv, nk * dk, 2 * nk * dk).reshape(n, nk, dk), L2NORM_EPS)
        v = ops.take_last(conv, 2 * nk * dk, c.conv_dim).reshape(n, nv, dv)
        out, after, log = ops.deltanet_scan(start, q, k, v, decay, beta)
        return out, after, log, new_tail

    def deltanet_tree(self, win, mixed, start, decay, beta, i):
        """A tree's rows one at a time, each as the one-row step it stands for: its conv window is its ancestors'
        inputs running on into the stream's tail, and its scan starts from its parent's state."""
        ops, tail = self.ops, win.state.conv_tail[i]
        history = tail.shape[0]
        outs, states, logs = [], [], []
        for r in range(len(win.ids)):
            path = win.ancestors(r)[:history][::-1]  # up to K - 1 ancestors, oldest first
            own_tail = ops.concat_rows([tail[len(path):]] + [mixed[a:a + 1] for a in path])
            parent = win.parents[r]
            out, after, log, _ = self.deltanet_rows(mixed[r:r + 1], own_tail, start if parent < 0 else states[parent],
                                                    decay[r:r + 1], beta[r:r + 1], i)
            outs.append(out)
            states.append(after)
            logs.append(log)
        log = tuple(ops.concat_rows([row[part] for row in logs]) for part in range(3))
        return ops.concat_rows(outs), log, states

    def attention(self, x, windows, spans, i):
        """A gated full-attention layer: q/gate interleaved per head, q/k norms, partial RoPE, GQA, sigmoid gate."""
        c, ops, w = self.config, self.ops, self.weights
        p = f"layers.{i}.self_attn."
        rows, heads, kv_heads, hd = x.shape[0], c.num_attention_heads, c.num_key_value_heads, c.head_dim
        positions = np.concatenate([win.positions for win in windows])
        q_and_gate = ops.linear(x, w[p + "q_proj.weight"]).reshape(rows, heads, 2 * hd)  # per head: query, gate
        q = ops.take_last(q_and_gate, 0, hd)
        gate = ops.take_last(q_and_gate, hd, 2 * hd).reshape(rows, heads * hd)
        k = ops.linear(x, w[p + "k_proj.weight"]).reshape(rows, kv_heads, hd)
        v = ops.linear(x, w[p + "v_proj.weight"]).reshape(rows, kv_heads, hd)
        q = ops.rope(ops.rmsnorm(q, w[p + "q_norm.weight"], c.rms_norm_eps), positions, c.rotary_dim, c.rope_theta)
        k = ops.rope(ops.rmsnorm(k, w[p + "k_norm.weight"], c.rms_norm_eps), positions, c.rotary_dim, c.rope_theta)
        outs = []
        for win, (a, b) in zip(windows, spans):  # each row reads its own stream's keys, up to its own position
            if win.parents is not None:
                outs.append(self.attention_tree(win, q[a:b], k[a:b], v[a:b], i))
                continue
            state = win.state
            state.keys[i] = ops.append_rows(state.keys[i], state.length, k[a:b], state.max_rows)
            state.values[i] = ops.append_rows(state.values[i], state.length, v[a:b], state.max_rows)
            partial = ops.attention_partial(q[a:b], state.keys[i], state.values[i], win.positions + 1,
                                            1.0 / math.sqrt(hd))
            outs.append(ops.attention_merge(*partial))
        out = (ops.concat_rows(outs) if len(outs) > 1 else outs[0]).reshape(rows, heads * hd)
        return ops.linear(ops.sigmoid_mul(out, gate), w[p + "o_proj.weight"])

    def attention_tree(self, win, q, k, v, i):
        """A tree's rows in depth-first order: each writes its key and value at length + depth, over whatever a
        finished branch left there, so that when a row reads keys 0 .. its position, the ones past the stream
        are exactly its ancestors' and its own (as in the one-row steps it stands for)."""
        ops, state = self.ops, win.state
        depths, children = win.depths, {r: [] for r in range(-1, len(win.ids))}
        for r, parent in enumerate(win.parents):
            children[parent].append(r)
        order, todo = [], [0]
        while todo:  # preorder: a row comes before its children, a finished subtree before the next sibling
            r = todo.pop()
            order.append(r)
            todo.extend(reversed(children[r]))
        outs = [None] * len(win.ids)
        for r in order:
            slot = state.length + depths[r]
            state.keys[i] = ops.append_rows(state.keys[i], slot, k[r:r + 1], state.max_rows)
            state.values[i] = ops.append_rows(state.values[i], slot, v[r:r + 1], state.max_rows)
            partial = ops.attention_partial(q[r:r + 1], state.keys[i], state.values[i], np.array([slot + 1]),
                                            1.0 / math.sqrt(self.config.head_dim))
            outs[r] = ops.attention_merge(*partial)
        state.tree_kv[i] = (k, v)  # a kept path's rows are written again in path order
        return ops.concat_rows(outs)
