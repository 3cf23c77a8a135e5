"""The Qwen3.5 hybrid forward pass over one round's rows, built from the kernel families through a backend.

Every layer is pre-norm residual: `h += mixer(norm(h))`, `h += mlp(norm(h))`, where the mixer is a Gated DeltaNet
layer or a gated full-attention layer (config.layer_types).

A round runs the windows of several streams at once (rows.py). Row-wise work (projections, norms, the MLP, the head)
runs once over every row of the round; the work that reads a stream's history (the conv, the DeltaNet scan, RoPE
positions, attention) runs window by window against that stream's cache (cache.py), one launch per window for each,
chain or tree alike; the conv and the DeltaNet scan of a recorded round of one-row windows whose states are one lane
pool's (an engine's lanes) run for every window in one launch each. Every op's arithmetic for one row is independent of
the rows beside it, so a row computes the same bits in a prompt pass, in a one-row step, beside another stream's window,
or beside its siblings in a tree. A forward keeps nothing: the stream's `keep` commits the rows the round accepted.
"""
import math

import numpy as np

from tensorfold.cuda.attention import CHUNK as KEYS_A_PARTIAL
from tensorfold.model.cache import DeltaNetRecord, KeepPolicy, LanePool, StreamState
from tensorfold.model.config import ModelConfig
from tensorfold.model.moe import sparse_block, upload_sparse_block
from tensorfold.model.projections import PROJECTIONS, stack_projections
from tensorfold.model.rows import RoundInputs, Window

L2NORM_EPS = 1e-6  # DeltaNet's query/key L2 norm uses a fixed eps, not rms_norm_eps
PARTIALS_BYTES = 256 << 20  # the most an attention call's partial sums may take: a long chunk attends in row slices


class Qwen35:
    """The text model: config, weights (by canonical name, on the backend) and the backend that runs its ops.

    `projections` holds, per layer and group of PROJECTIONS, the GEMVs that compute the group: (weight, output
    widths) pairs, a stacked weight where neighbouring projections share a form. `weights` keeps every projection
    under its own name, as a view of the rows it has in its stack, so no weight is held twice. An MoE model's
    layers have the sparse block (moe.py) for an MLP: `experts` holds each layer's routed experts."""

    def __init__(self, config: ModelConfig, weights: dict, backend):
        self.config, self.ops = config, backend
        weights, self.weights, self.projections, self.experts = dict(weights), {}, {}, {}
        for i, kind in enumerate(config.layer_types):
            dense_groups = ("mlp.",) if not config.is_moe else ()
            for group in ("linear_attn." if kind == "linear_attention" else "self_attn.",) + dense_groups:
                prefix = f"layers.{i}.{group}"
                self.projections[prefix], views = stack_projections(prefix, PROJECTIONS[group], weights,
                                                                    backend.upload)
                self.weights.update(views)
            if config.is_moe:
                upload_sparse_block(self, f"layers.{i}.mlp.", weights)
        self.weights.update({name: backend.upload(w) for name, w in weights.items()})
        self.lm_head = self.weights.get("lm_head.weight", self.weights["embed_tokens.weight"])

    def project(self, x, prefix: str) -> list:
        """The outputs of the projections of group `prefix` (e.g. "layers.3.mlp.") for the rows x, in the order of
        PROJECTIONS: one GEMV per stacked weight, which writes each projection's output as its own array."""
        return [y for weight, widths in self.projections[prefix] for y in self.ops.linear_parts(x, weight, widths)]

    def new_state(self, max_rows: int | None = None, policy: KeepPolicy = KeepPolicy(), pool: LanePool | None = None,
                  lane: int = 0) -> StreamState:
        return StreamState(self.config, self.ops, max_rows, policy, pool, lane)

    def lane_pool(self, lanes: int) -> LanePool:
        """The DeltaNet states and conv tails of `lanes` lanes in one array a layer each (cache.LanePool)."""
        return LanePool(self.config, self.ops, lanes)

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
        """The layer's MLP: the SwiGLU of a dense model, the sparse block of an MoE one (moe.py)."""
        return sparse_block(self, x, p) if self.config.is_moe else self.swiglu_mlp(x, p)

    def swiglu_mlp(self, x, p):
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
        state), writing their rows into arrays of the whole round; everything else runs once over every row. A
        recorded round of one-row windows of one lane pool (`inputs.lanes`) convolves and scans them all in one
        launch each, every window from its lane's tail and state and written over them, as the in-place one-row conv
        and scan do window by window."""
        c, ops, w = self.config, self.ops, self.weights
        p = f"layers.{i}.linear_attn."
        nk, nv = c.linear_num_key_heads, c.linear_num_value_heads
        dk, dv = c.linear_key_head_dim, c.linear_value_head_dim
        rows = x.shape[0]
        mixed, z, b_proj, a_proj = self.project(x, p)  # mixed [rows, C]: q | k | v, each head-major
        z = z.reshape(rows, nv, dv)
        conv, tails = ops.empty((rows, c.conv_dim)), []
        pool = windows[0].state.pool if inputs.lanes is not None else None  # one-row windows of one lane pool
        if pool is not None:  # every lane's tail in one launch, shifted in place
            ops.causal_conv_lanes(mixed, pool.tails[i], inputs.lanes, w[p + "conv1d.weight"], conv)
            tails = [win.state.conv_tail[i] for win in windows]
        else:
            with ops.side_by_side(len(windows)) as lanes:  # in a graph recording, each window's kernels on their own
                for n, (win, (a, b)) in enumerate(zip(windows, spans)):
                    with lanes.lane(n):
                        tails.append(ops.causal_conv(mixed[a:b], win.state.conv_tail[i], w[p + "conv1d.weight"],
                                                     win.maps.conv_taps, out=conv[a:b], in_place=inputs.in_place)[1])
        q, k, v, decay, beta = ops.scan_inputs(conv, b_proj, a_proj, w[p + "A_log"], w[p + "dt_bias"], nk, dk,
                                               L2NORM_EPS, 1.0 / math.sqrt(dk))  # q, k L2-normed per head
        v = v.reshape(rows, nv, dv)
        out = ops.empty((rows, nv, dv))
        if pool is not None:  # every lane's state in one launch, written over it
            log = ops.deltanet_scan_lanes(pool.states[i], inputs.lanes, q, k, v, decay, beta, out)
            for win, (a, b), new_tail in zip(windows, spans, tails):
                state = win.state.recurrent[i]
                win.state.records[i] = DeltaNetRecord(state, state, tuple(part[a:b] for part in log), mixed[a:b],
                                                      win.state.conv_tail[i], new_tail)
        else:
            with ops.side_by_side(len(windows)) as lanes:
                for n, (win, (a, b), new_tail) in enumerate(zip(windows, spans, tails)):
                    state, maps = win.state, win.maps
                    with lanes.lane(n):
                        start = state.scan_start(i)  # the pending rows of the deferred keep, replayed first
                        # A recorded one-row round writes the new state over the stored one (replay.py); otherwise the
                        # keep decides which state the stream goes on from.
                        _, after, log = ops.deltanet_scan(start, q[a:b], k[a:b], v[a:b], decay[a:b], beta[a:b],
                                                          maps.depths, maps.path_slots, out=out[a:b],
                                                          in_place=inputs.in_place)
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
                    self._attend(q, k, v, q_and_gate, out, win, i, inputs, a, b)
        return ops.linear(out.reshape(rows, heads * hd), w[p + "o_proj.weight"])

    def _attend(self, q, k, v, q_and_gate, out, win, i, inputs, a, b):
        """Window `win`'s attention in layer i, over the round's rows a .. b - 1: its keys and values written at
        length + slot, then its rows' partials over the stream's committed keys and their paths', merged into out
        and multiplied there by sigmoid(gate), the layer's output gate (each head's second half of q_and_gate)."""
        ops, state = self.ops, win.state
        scale = 1.0 / math.sqrt(self.config.head_dim)
        ops.kv_write(state.keys[i], state.values[i], k[a:b], v[a:b], inputs.write_at[a:b])
        if inputs.recorded:  # a decode round: its partials cover the cache (the lengths change from replay to replay)
            partial = ops.attention_partial(q[a:b], state.keys[i], state.values[i], inputs.n_keys[a:b], scale,
                                            *self._tree_maps(win, inputs, a, b))
            ops.attention_merge(*partial, out=out[a:b], q_and_gate=q_and_gate[a:b])
            return
        # Eager: each slice's partials cover the keys of its last row, the one that reads the most. A chain's rows
        # go in slices whose partials fit in PARTIALS_BYTES (a row's bits do not depend on the rows beside it, nor
        # on chunks it does not reach): a long prompt chunk's partials grow with its rows times its keys.
        per_row = 4 * self.config.num_attention_heads * (self.config.head_dim + 2) * -(-(state.length + b - a)
                                                                                         // KEYS_A_PARTIAL)
        step = max(1, PARTIALS_BYTES // per_row) if win.parents is None else b - a
        for first in range(a, b, step):
            last = min(first + step, b)
            partial = ops.attention_partial(q[first:last], state.keys[i], state.values[i], inputs.n_keys[first:last],
                                            scale, *self._tree_maps(win, inputs, first, last),
                                            max_keys=state.length + (last - a if win.parents is None else b - a))
            ops.attention_merge(*partial, out=out[first:last], q_and_gate=q_and_gate[first:last])

    @staticmethod
    def _tree_maps(win, inputs, a, b) -> tuple:
        """A tree's (committed, path_slots) for attention over rows a .. b - 1; none for a chain, whose keys sit in
        order (every row reads cache rows 0 .. n - 1 in place)."""
        return () if win.parents is None else (inputs.committed[a:b], win.maps.path_slots)
