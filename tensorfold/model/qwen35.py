"""The Qwen3.5 hybrid forward pass over one round's rows, built from the kernel families through a backend.

Every layer is pre-norm residual: `h += mixer(norm(h))`, `h += mlp(norm(h))`, where the mixer is a Gated DeltaNet
layer or a gated full-attention layer (config.layer_types).

A round runs the windows of several streams at once. A window continues one stream: a prompt chunk, one decode
row, a drafted chain, or a drafted tree. Row-wise work (projections, norms, the MLP, the head) runs once over every
row of the round; the work that reads a stream's history (the conv, the DeltaNet scan, RoPE positions, attention)
runs window by window against that stream's cache, one launch per window for each, chain or tree alike: the
window's index maps (tensorfold/cuda/paths.py) tell each row which rows are its ancestors. Every op's arithmetic for
one row is independent of the rows beside it, so a row computes the same bits in a prompt pass, in a one-row step,
beside another stream's window, or beside its siblings in a tree.

A forward leaves each stream's cache as it was and records what the window would add; `StreamState.keep(n)` then
commits the first n rows (all of them for a prompt chunk or a decode row, the accepted prefix of a drafted chain),
and `keep_path` the path a tree's walk accepted: the DeltaNet state replays the scan's log for those rows, the conv
tail moves along them, a tree's kept key/value rows move down to length + depth, and the rows past them are left to
be overwritten.
"""
import dataclasses
import functools
import math
import weakref

import numpy as np

from tensorfold.model.config import ModelConfig
from tensorfold.numerics import paths  # defines: chain, depths, path_slots, conv_taps (host NumPy, no numba)

L2NORM_EPS = 1e-6  # DeltaNet's query/key L2 norm uses a fixed eps, not rms_norm_eps


@dataclasses.dataclass
class DeltaNetRecord:
    """What one window did to one DeltaNet layer, kept until the stream keeps some of its rows."""
    before: object  # the state the scan started from
    after: object  # the state after the window's last row (along its path, in a tree)
    log: tuple  # (decay, delta, key) per row: replaying a path's rows in order gives the state after its last row
    inputs: object  # the raw conv inputs of the window's rows
    tail: object  # the conv tail the window started from
    new_tail: object  # the conv tail after the window's last row (along its path, in a tree)


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
        self.kept_on_device = False  # a replayed decode graph has already written its one row into the cache
        self.pending_rows = 0  # kept DeltaNet rows not yet applied to `recurrent` (the same count in every layer)
        self.pending = {}  # layer -> (decay, delta, key) of the pending rows, in path order
        self.recurrent, self.conv_tail, self.keys, self.values, self.records = {}, {}, {}, {}, {}
        self.home = {}  # layer -> (state, tail): the buffers `settle` copies the DeltaNet results into
        for i, kind in enumerate(c.layer_types):
            if kind == "linear_attention":
                self.recurrent[i] = ops.zeros((c.linear_num_value_heads, c.linear_key_head_dim,
                                               c.linear_value_head_dim))
                self.conv_tail[i] = ops.zeros((c.linear_conv_kernel_dim - 1, c.conv_dim))
                self.home[i] = (self.recurrent[i], self.conv_tail[i])
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
        self.records = {}
        if self.pending_rows >= self.policy.threshold:
            self.land()

    def keep(self, n: int, write_back: bool = False) -> None:
        """Commit the first n rows of the last (chain) window (0 <= n <= its rows). Their DeltaNet rows go to the
        pending buffer under a late policy, unless `write_back` (a prompt chunk), the window had one row, or they do
        not fit; then the state is written at once."""
        assert 0 <= n <= self.window_rows, f"cannot keep {n} of {self.window_rows} window rows"
        if self.kept_on_device:  # a decode graph's round: the device holds the row already, count it
            assert n == 1, "a decode graph's round keeps its one row"
            self.kept_on_device = False
            self._committed(1, deferred=False)
            return
        self._keep(list(range(n)), write_back)

    def reserve(self, rows: int) -> None:
        """Make room for `rows` more key/value rows past the committed length (growing buffers before a forward
        that must not grow them: a recorded decode round)."""
        for i in self.keys:
            self.keys[i] = self.ops.reserve_rows(self.keys[i], self.length, self.length + rows, self.max_rows)
            self.values[i] = self.ops.reserve_rows(self.values[i], self.length, self.length + rows, self.max_rows)

    def settle(self) -> None:
        """Put the DeltaNet states and conv tails back in the stream's own buffers: an eager keep points them at the
        scan's outputs, and a recorded decode round needs the same addresses from round to round."""
        for i, (state, tail) in self.home.items():
            if self.recurrent[i] is not state:
                self.ops.copy_into(state, self.recurrent[i])
                self.recurrent[i] = state
            if self.conv_tail[i] is not tail:
                self.ops.copy_into(tail, self.conv_tail[i])
                self.conv_tail[i] = tail

    def commit_in_place(self) -> None:
        """Write the last one-row window's DeltaNet state and conv tail over the stored ones, in place (a recorded
        decode round, whose replays must find the next round's state at the same addresses)."""
        assert self.window_rows == 1 and not self.pending_rows, "in-place commits are for one-row windows"
        for i, record in self.records.items():
            if record.after is not self.recurrent[i]:  # the scan wrote it in place already, if asked to
                self.ops.copy_into(self.recurrent[i], record.after)
            if record.new_tail is not self.conv_tail[i]:  # and so did the conv
                self.ops.copy_into(self.conv_tail[i], record.new_tail)

    def settled_buffers(self) -> tuple:
        """What a recorded round reads and writes, once `settle` has run: the round is valid while these are the same
        objects. The DeltaNet states and conv tails are then the stream's own (`home`, fixed for its life), so the
        first of them stands for them all; the key/value buffers grow."""
        own = [state for state, _ in self.home.values()][:1]
        return (*own, *self.keys.values(), *self.values.values())

    def keep_path(self, path: list) -> None:
        """Commit a tree window's rows along `path` (the root, then each kept row a child of the one before)."""
        assert self.window_rows and all(0 <= r < self.window_rows for r in path), "keep a path of the last window"
        self._keep(list(path), write_back=False)

    def _keep(self, path: list, write_back: bool) -> None:
        """Commit the last window's rows along `path`: the DeltaNet rows (pending, or into the state), the conv tail
        moved along the path, and a tree path's key/value rows moved from length + slot to length + depth."""
        n, rows = len(path), self.window_rows
        p, ops = self.policy, self.ops
        defer = p.late and not write_back and rows > 1 and self.pending_rows + n <= p.capacity
        to_last_row = n > 0 and path[-1] == rows - 1  # the scan's final state and the conv's new tail are this path's
        for i, record in self.records.items():
            if n == 0:
                continue
            if defer:
                self._pend(i, tuple(self._rows(part, path) for part in record.log))
            elif to_last_row:
                self.recurrent[i] = record.after  # record.before already had the pending rows replayed
            else:
                self.recurrent[i] = ops.deltanet_apply(record.before, record.log, path)
            self.conv_tail[i] = record.new_tail if to_last_row else self._tail_after(record, path)
        if path != list(range(n)):  # a tree's path: its rows were written at length + slot
            for i in self.keys:
                self.keys[i], self.values[i] = ops.kv_compact(self.keys[i], self.values[i], self.length, path)
        self._committed(n, defer)

    def _rows(self, part, path):
        """The rows `path` of a log part, in order (a chain's prefix as a slice)."""
        return part[:len(path)] if path == list(range(len(path))) else self.ops.concat_rows(
            [part[r:r + 1] for r in path])

    def _tail_after(self, record: DeltaNetRecord, path: list):
        """The conv tail after keeping `path`: its last K - 1 inputs, running on into the window's old tail."""
        history = record.tail.shape[0]
        last = ([(record.tail, s) for s in range(history)] + [(record.inputs, r) for r in path])[-history:]
        return self.ops.concat_rows([rows[s:s + 1] for rows, s in last])


@dataclasses.dataclass(frozen=True)
class RowMaps:
    """A window's index maps (tensorfold/cuda/paths.py) on the backend: with them the conv, the DeltaNet scan and
    attention each run every row of the window, chain or tree, in one launch."""
    depths: object  # [rows] int32: each row's ancestors in the window
    path_slots: object  # [rows, deepest + 1] int32: row r's ancestors' slots, root first, then r
    conv_taps: object  # [rows, K] int32: row r's conv window, as rows of [conv tail; window inputs]


_CHAIN_MAPS = weakref.WeakKeyDictionary()  # backend -> {rows: RowMaps}: a chain's maps depend only on its length


@dataclasses.dataclass(frozen=True)
class RoundInputs:
    """The per-row integers of a round, on the backend, uploaded once: each row's token id, its position (its
    stream's length + its depth), the keys it reads (position + 1), and the cache row its key and value go to (its
    stream's length + its slot in the window). A recorded decode round (graphs.py) reads them from a buffer that
    is rewritten before each replay."""
    ids: object
    positions: object
    n_keys: object
    write_at: object
    recorded: bool = False  # the attention's chunks cover each stream's whole cache (key counts change per replay)

    @staticmethod
    def table(windows) -> np.ndarray:
        """[4, rows] int32 on the host: ids, positions, n_keys and write_at, window after window. (Built from
        Python lists: a decode round's windows are one row each, and NumPy calls a window cost more than its rows.)"""
        ids = [token for win in windows for token in win.ids]
        positions = [position for win in windows for position in win.positions]
        write_at = [win.state.length + slot for win in windows for slot in range(len(win.ids))]
        return np.array([ids, positions, [p + 1 for p in positions], write_at], np.int32)

    @classmethod
    def on(cls, ops, table, recorded=False) -> "RoundInputs":
        """The inputs over a [4, rows] table on the backend (uploaded if it is a host array)."""
        table = ops.upload(table) if isinstance(table, np.ndarray) else table
        return cls(table[0], table[1], table[2], table[3], recorded)


@dataclasses.dataclass
class Window:
    """One stream's rows in a round: `ids` continue `state`; logits for "all" rows or the "last".

    Without `parents` the rows are a chain (row r follows row r - 1). With them they are a tree: `parents[r]` is the
    row that row r follows (-1 for row 0, the root, which follows the stream), always an earlier row. A row sits at
    position length + its depth, and sees the stream and its own ancestors, never its siblings."""
    state: StreamState
    ids: list
    logits_for: str = "all"
    parents: list | None = None
    features: list | None = None  # after a forward with taps: each tapped layer's output at the window's rows

    @property
    def parent_rows(self) -> list:
        """`parents`, or a chain's."""
        return paths.chain(len(self.ids)) if self.parents is None else self.parents

    @property
    def depths(self) -> list:
        if self.parents is None:  # a chain: row r at depth r
            return list(range(len(self.ids)))
        for r, parent in enumerate(self.parent_rows):
            assert (r == 0) == (parent == -1) and parent < r, f"row {r}: parent {parent} must be an earlier row"
        return paths.depths(self.parent_rows).tolist()

    @property
    def positions(self) -> list:
        """Each row's position: its stream's committed length plus its depth."""
        return [self.state.length + depth for depth in self.depths]

    @functools.cached_property
    def maps(self) -> RowMaps:
        """The index maps, built and uploaded once a round (they do not depend on the stream's length); a chain's
        once per backend and length."""
        if self.parents is None:
            chains = _CHAIN_MAPS.setdefault(self.state.ops, {})
            if len(self.ids) not in chains:
                chains[len(self.ids)] = self._build_maps()
            return chains[len(self.ids)]
        return self._build_maps()

    def _build_maps(self) -> RowMaps:
        parents, ops = self.parent_rows, self.state.ops
        width = self.state.config.linear_conv_kernel_dim
        return RowMaps(ops.upload(paths.depths(parents)), ops.upload(paths.path_slots(parents)),
                       ops.upload(paths.conv_taps(parents, width)))

    def ancestors(self, r: int) -> list:
        """Row r's ancestors in the window, nearest first."""
        chain = []
        while self.parent_rows[r] >= 0:
            r = self.parent_rows[r]
            chain.append(r)
        return chain


# The projections of a layer that read the same x, in the order a layer uses their outputs: each group whose
# weights share a form runs as one GEMV over their rows stacked (one launch instead of up to four; a one-row GEMV of
# 16 outputs costs about what one of 2,048 does). Each output's sum depends only on its own weight row and x, so a
# stacked GEMV gives every output the bits of its own projection's.
PROJECTIONS = {"linear_attn.": ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"),
               "self_attn.": ("q_proj", "k_proj", "v_proj"), "mlp.": ("gate_proj", "up_proj")}


def stacked_rows(linears: list):
    """One Linear holding the rows of `linears` (same form and width) one after another."""
    first = linears[0]
    stack = lambda field: None if getattr(first, field) is None else np.concatenate(  # noqa: E731
        [getattr(w, field) for w in linears])
    return dataclasses.replace(first, out_features=sum(w.out_features for w in linears), data=stack("data"),
                               scales=stack("scales"), biases=stack("biases"))


def rows_of(linear, start: int, stop: int):
    """Rows start .. stop - 1 of a Linear, as views of its arrays (NumPy or device arrays alike)."""
    view = lambda a: None if a is None else a[start:stop]  # noqa: E731
    return dataclasses.replace(linear, out_features=stop - start, data=view(linear.data),
                               scales=view(linear.scales), biases=view(linear.biases))


def form(linear) -> tuple:
    """What two Linears must share to be stacked."""
    return linear.kind, linear.in_features, linear.bits, linear.group_size


class Qwen35:
    """The text model: config, weights (by canonical name, on the backend) and the backend that runs its ops.

    `projections` holds, per layer and group of PROJECTIONS, the GEMVs that compute the group: (weight, output
    widths) pairs, a stacked weight where neighbouring projections share a form. `weights` keeps every projection
    under its own name, as a view of the rows it has in its stack, so no weight is held twice."""

    def __init__(self, config: ModelConfig, weights: dict, backend):
        self.config, self.ops = config, backend
        weights, self.weights, self.projections = dict(weights), {}, {}
        for i, kind in enumerate(config.layer_types):
            for group in ("linear_attn." if kind == "linear_attention" else "self_attn.", "mlp."):
                self._stack(f"layers.{i}.{group}", PROJECTIONS[group], weights)
        self.weights.update({name: backend.upload(w) for name, w in weights.items()})
        self.lm_head = self.weights.get("lm_head.weight", self.weights["embed_tokens.weight"])

    def _stack(self, prefix: str, names: tuple, weights: dict) -> None:
        """Upload the projections `names` of `prefix` (taken out of `weights`) as stacks of neighbours of one form;
        record each stack in `projections` and each projection's rows of it in `self.weights`."""
        runs = []  # neighbouring projections of one form: [(name, Linear), ...] each
        for name in names:
            linear = weights.pop(prefix + name + ".weight")
            if runs and form(runs[-1][-1][1]) == form(linear):
                runs[-1].append((name, linear))
            else:
                runs.append([(name, linear)])
        self.projections[prefix] = []
        for run in runs:
            stacked = self.ops.upload(stacked_rows([linear for _, linear in run]))
            widths = [linear.out_features for _, linear in run]
            self.projections[prefix].append((stacked, widths))
            for (name, _), start, width in zip(run, np.cumsum([0] + widths), widths):
                self.weights[prefix + name + ".weight"] = rows_of(stacked, int(start), int(start) + width)

    def project(self, x, prefix: str) -> list:
        """The outputs of the projections of group `prefix` (e.g. "layers.3.mlp.") for the rows x, in the order of
        PROJECTIONS: one GEMV per stacked weight, which writes each projection's output as its own array."""
        return [y for weight, widths in self.projections[prefix] for y in self.ops.linear_parts(x, weight, widths)]

    def new_state(self, max_rows: int | None = None, policy: KeepPolicy = KeepPolicy()) -> StreamState:
        return StreamState(self.config, self.ops, max_rows, policy)

    def forward(self, ids, state: StreamState, logits_for="all"):
        """One window on its own, kept whole and written back: the logits of `ids` continuing `state`."""
        logits = self.forward_round([Window(state, list(ids), logits_for)])[0]
        state.keep(len(ids), write_back=True)
        return logits

    def forward_round(self, windows: list, taps: tuple = (), inputs: RoundInputs | None = None) -> list:
        """Run every window of a round in one pass; returns each window's logits. Nothing is kept yet.

        `taps` names layers whose outputs (the residual stream after the layer, before the final norm) a block
        drafter reads: each window's `features` gets them, one [rows, hidden] array per tapped layer. `inputs` are
        the round's integers on the backend (by default uploaded from the windows)."""
        logits, starts = self.forward_logits(windows, taps, inputs)
        return [logits[a:b] for a, b in zip(starts[:-1], starts[1:])]

    def forward_logits(self, windows: list, taps: tuple = (), inputs: RoundInputs | None = None) -> tuple:
        """`forward_round`'s logits as one array, every window's rows after the window before's, and where each
        window's rows start in it (a last entry: the end). Sampling reads the array as it is, with no copy."""
        c, w, ops = self.config, self.weights, self.ops
        bounds = np.cumsum([0] + [len(win.ids) for win in windows])
        spans = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
        for win in windows:
            assert win.ids and win.state.window_rows == 0, "a stream runs one non-empty window per round"
        inputs = inputs or RoundInputs.on(ops, RoundInputs.table(windows))
        for win in windows:
            win.state.window_rows = len(win.ids)
            win.state.reserve(len(win.ids))  # key/value rows at length + slot (no-op in a recorded round)
        h = ops.embed(inputs.ids, w["embed_tokens.weight"])
        x = ops.rmsnorm(h, w["layers.0.input_layernorm.weight"], c.rms_norm_eps)
        tapped = {}
        for i, kind in enumerate(c.layer_types):  # each residual add and the norm after it: one op, add_rmsnorm
            p = f"layers.{i}."
            mixer = self.deltanet if kind == "linear_attention" else self.attention
            h, x = ops.add_rmsnorm(h, mixer(x, windows, spans, i, inputs), w[p + "post_attention_layernorm.weight"],
                                   c.rms_norm_eps)
            if i + 1 < c.num_hidden_layers:
                h, x = ops.add_rmsnorm(h, self.mlp(x, p + "mlp."), w[f"layers.{i + 1}.input_layernorm.weight"],
                                       c.rms_norm_eps)
            else:  # the final norm reads only the rows whose logits are wanted
                h = ops.add(h, self.mlp(x, p + "mlp."))
            if i in taps:
                tapped[i] = h
        for win, (a, b) in zip(windows, spans):
            win.features = [tapped[i][a:b] for i in taps] if taps else None
        wanted = [(a, b) if win.logits_for == "all" else (b - 1, b) for win, (a, b) in zip(windows, spans)]
        if all(win.logits_for == "all" for win in windows):  # every row: h as it is
            rows = h
        elif len(windows) == 1:
            rows = h[wanted[0][0]:wanted[0][1]]
        else:
            rows = ops.concat_rows([h[a:b] for a, b in wanted])
        logits = ops.linear(ops.rmsnorm(rows, w["norm.weight"], c.rms_norm_eps), self.lm_head)
        return logits, [int(n) for n in np.cumsum([0] + [b - a for a, b in wanted])]

    def mlp(self, x, p):
        """SwiGLU: down(SiLU(gate(x)) * up(x)). Gate and up stacked in one weight (the same form, as in every
        checkpoint we know) run as one GEMV that writes the product itself (ops.swiglu)."""
        ops, w = self.ops, self.weights
        stacks = self.projections[p]
        if len(stacks) == 1:
            hidden = ops.swiglu(x, stacks[0][0])
        else:  # gate and up of different forms: two GEMVs, then the product
            gate, up = self.project(x, p)
            hidden = ops.silu_mul(gate, up)
        return ops.linear(hidden, w[p + "down_proj.weight"])

    def deltanet(self, x, windows, spans, i, inputs):
        """A Gated DeltaNet layer: projections, causal conv, L2-normed q/k, gated delta rule, gated norm, out.

        The conv and the scan read each stream's own history, so they run window by window (each row's conv
        window is its ancestors' inputs running on into the stream's tail, and its scan starts from its parent's
        state), writing their rows into arrays of the whole round; everything else runs once over every row."""
        c, ops, w = self.config, self.ops, self.weights
        p = f"layers.{i}.linear_attn."
        nk, nv = c.linear_num_key_heads, c.linear_num_value_heads
        dk, dv = c.linear_key_head_dim, c.linear_value_head_dim
        rows = x.shape[0]
        mixed, z, b_proj, a_proj = self.project(x, p)  # mixed [rows, C]: q | k | v, each head-major
        z = z.reshape(rows, nv, dv)
        conv, tails = ops.empty((rows, c.conv_dim)), []
        with ops.side_by_side(len(windows)) as lanes:  # in a graph recording, each window's kernels on their own
            for n, (win, (a, b)) in enumerate(zip(windows, spans)):
                with lanes.lane(n):
                    tails.append(ops.causal_conv(mixed[a:b], win.state.conv_tail[i], w[p + "conv1d.weight"],
                                                 win.maps.conv_taps, out=conv[a:b], in_place=inputs.recorded)[1])
        q, k, v, decay, beta = ops.scan_inputs(conv, b_proj, a_proj, w[p + "A_log"], w[p + "dt_bias"], nk, dk,
                                               L2NORM_EPS, 1.0 / math.sqrt(dk))  # q, k L2-normed per head
        v = v.reshape(rows, nv, dv)
        out = ops.empty((rows, nv, dv))
        with ops.side_by_side(len(windows)) as lanes:
            for n, (win, (a, b), new_tail) in enumerate(zip(windows, spans, tails)):
                state, maps = win.state, win.maps
                with lanes.lane(n):
                    start = state.scan_start(i)  # the pending rows of the deferred keep, replayed first
                    # A recorded decode round writes the new state over the stored one (graphs.py); otherwise the
                    # keep decides which state the stream goes on from.
                    _, after, log = ops.deltanet_scan(start, q[a:b], k[a:b], v[a:b], decay[a:b], beta[a:b],
                                                      maps.depths, maps.path_slots, out=out[a:b],
                                                      in_place=inputs.recorded)
                state.records[i] = DeltaNetRecord(start, after, log, mixed[a:b], state.conv_tail[i], new_tail)
        y = ops.rmsnorm_gated(out, z, w[p + "norm.weight"], c.rms_norm_eps)
        return ops.linear(y.reshape(rows, nv * dv), w[p + "out_proj.weight"])

    def attention(self, x, windows, spans, i, inputs):
        """A gated full-attention layer: q/gate interleaved per head, q/k norms, partial RoPE, GQA, sigmoid gate."""
        c, ops, w = self.config, self.ops, self.weights
        p = f"layers.{i}.self_attn."
        rows, heads, kv_heads, hd = x.shape[0], c.num_attention_heads, c.num_key_value_heads, c.head_dim
        positions = inputs.positions
        q_and_gate, k, v = self.project(x, p)
        q_and_gate = q_and_gate.reshape(rows, heads, 2 * hd)  # per head: query, gate
        k, v = k.reshape(rows, kv_heads, hd), v.reshape(rows, kv_heads, hd)
        q, k = ops.norm_rope(q_and_gate, k, w[p + "q_norm.weight"], w[p + "k_norm.weight"], c.rms_norm_eps, positions,
                             c.rotary_dim, c.rope_theta)  # each head normalised, then rotated
        out = ops.empty((rows, heads, hd))
        with ops.side_by_side(len(windows)) as lanes:
            for n, (win, (a, b)) in enumerate(zip(windows, spans)):  # each row reads its stream's keys, then its path's
                with lanes.lane(n):
                    self._attend(q, k, v, q_and_gate[a:b, :, hd:], out, win, i, inputs, a, b)
        return ops.linear(out.reshape(rows, heads * hd), w[p + "o_proj.weight"])

    def _attend(self, q, k, v, gate, out, win, i, inputs, a, b):
        """Window `win`'s attention in layer i, over the round's rows a .. b - 1: its keys and values written at
        length + slot, then its rows' partials over the stream's committed keys and their paths', merged into out
        and multiplied there by sigmoid(gate), the layer's output gate."""
        ops, state = self.ops, win.state
        scale = 1.0 / math.sqrt(self.config.head_dim)
        ops.kv_write(state.keys[i], state.values[i], k[a:b], v[a:b], inputs.write_at[a:b])
        # Chunks for the row that reads the most keys; a recorded round's cover the cache (lengths change).
        max_keys = None if inputs.recorded else state.length + len(win.ids)
        if win.parents is None:  # a chain's keys sit in order: every row reads cache rows 0 .. n - 1 in place
            partial = ops.attention_partial(q[a:b], state.keys[i], state.values[i], inputs.n_keys[a:b], scale,
                                            max_keys=max_keys)
        else:
            partial = ops.attention_partial(q[a:b], state.keys[i], state.values[i], inputs.n_keys[a:b], scale,
                                            state.length, win.maps.path_slots, max_keys=max_keys)
        ops.attention_merge(*partial, out=out[a:b], gate=gate)
