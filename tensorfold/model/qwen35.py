"""The Qwen3.5 hybrid forward pass over a list of rows, built from the kernel families through a backend.

Every layer is pre-norm residual: `h += mixer(norm(h))`, `h += mlp(norm(h))`, where the mixer is a Gated DeltaNet
layer or a gated full-attention layer (config.layer_types). A prompt pass and a one-row step run the same code:
a pass over rows 0..n-1 is a chain whose rows each see their predecessors, and every op's arithmetic for one row
is independent of how many rows run beside it, so the two give the same bits.

Every array operation goes through `self.ops` (the backend), so the same code runs on NumPy and on the GPU.
"""
import math

import numpy as np

from .config import ModelConfig

L2NORM_EPS = 1e-6  # DeltaNet's query/key L2 norm uses a fixed eps, not rms_norm_eps


class StreamState:
    """One stream's cache: its length, and per layer the DeltaNet state and conv tail, or the attention keys and
    values (post-norm, post-RoPE; buffers that grow, of which rows [0, length) are live)."""

    def __init__(self, config: ModelConfig, ops):
        c = config
        self.length = 0
        self.recurrent, self.conv_tail, self.keys, self.values = {}, {}, {}, {}
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
        parts = [*self.recurrent.values(), *self.conv_tail.values(), *self.keys.values(), *self.values.values()]
        return sum(a.nbytes for a in parts)


class Qwen35:
    """The text model: config, weights (by canonical name, on the backend) and the backend that runs its ops."""

    def __init__(self, config: ModelConfig, weights: dict, backend):
        self.config, self.ops = config, backend
        self.weights = {name: backend.upload(w) for name, w in weights.items()}
        self.lm_head = self.weights.get("lm_head.weight", self.weights["embed_tokens.weight"])

    def new_state(self) -> StreamState:
        return StreamState(self.config, self.ops)

    def forward(self, ids, state: StreamState, logits_for="all"):
        """Run rows `ids` as the continuation of `state` (which advances); logits for "all" rows or the "last"."""
        c, w, ops = self.config, self.weights, self.ops
        positions = np.arange(state.length, state.length + len(ids))
        h = ops.embed(np.asarray(ids), w["embed_tokens.weight"])
        for i, kind in enumerate(c.layer_types):
            p = f"layers.{i}."
            x = ops.rmsnorm(h, w[p + "input_layernorm.weight"], c.rms_norm_eps)
            if kind == "linear_attention":
                h = ops.add(h, self.deltanet(x, state, i))
            else:
                h = ops.add(h, self.attention(x, state, i, positions))
            x = ops.rmsnorm(h, w[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
            h = ops.add(h, self.mlp(x, p + "mlp."))
        state.length += len(ids)
        if logits_for == "last":
            h = h[len(ids) - 1:]
        return ops.linear(ops.rmsnorm(h, w["norm.weight"], c.rms_norm_eps), self.lm_head)

    def mlp(self, x, p):
        ops, w = self.ops, self.weights
        gate = ops.linear(x, w[p + "gate_proj.weight"])
        up = ops.linear(x, w[p + "up_proj.weight"])
        return ops.linear(ops.silu_mul(gate, up), w[p + "down_proj.weight"])

    def deltanet(self, x, state, i):
        """A Gated DeltaNet layer: projections, causal conv, L2-normed q/k, gated delta rule, gated norm, out."""
        c, ops, w = self.config, self.ops, self.weights
        p = f"layers.{i}.linear_attn."
        rows = x.shape[0]
        nk, nv, dk, dv = c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
        mixed = ops.linear(x, w[p + "in_proj_qkv.weight"])  # [rows, C]: q | k | v, each head-major
        z = ops.linear(x, w[p + "in_proj_z.weight"]).reshape(rows, nv, dv)
        b = ops.linear(x, w[p + "in_proj_b.weight"])
        a = ops.linear(x, w[p + "in_proj_a.weight"])
        mixed, state.conv_tail[i] = ops.causal_conv(mixed, state.conv_tail[i], w[p + "conv1d.weight"])
        q = ops.take_last(mixed, 0, nk * dk).reshape(rows, nk, dk)
        k = ops.take_last(mixed, nk * dk, 2 * nk * dk).reshape(rows, nk, dk)
        v = ops.take_last(mixed, 2 * nk * dk, c.conv_dim).reshape(rows, nv, dv)
        q = ops.l2norm(q, L2NORM_EPS, scale=1.0 / math.sqrt(dk))
        k = ops.l2norm(k, L2NORM_EPS)
        decay, beta = ops.deltanet_gates(b, a, w[p + "A_log"], w[p + "dt_bias"])
        out, state.recurrent[i], _ = ops.deltanet_scan(state.recurrent[i], q, k, v, decay, beta)
        y = ops.rmsnorm_gated(out, z, w[p + "norm.weight"], c.rms_norm_eps)
        return ops.linear(y.reshape(rows, nv * dv), w[p + "out_proj.weight"])

    def attention(self, x, state, i, positions):
        """A gated full-attention layer: q/gate interleaved per head, q/k norms, partial RoPE, GQA, sigmoid gate."""
        c, ops, w = self.config, self.ops, self.weights
        p = f"layers.{i}.self_attn."
        rows, heads, kv_heads, hd = x.shape[0], c.num_attention_heads, c.num_key_value_heads, c.head_dim
        q_and_gate = ops.linear(x, w[p + "q_proj.weight"]).reshape(rows, heads, 2 * hd)  # per head: query, gate
        q = ops.take_last(q_and_gate, 0, hd)
        gate = ops.take_last(q_and_gate, hd, 2 * hd).reshape(rows, heads * hd)
        k = ops.linear(x, w[p + "k_proj.weight"]).reshape(rows, kv_heads, hd)
        v = ops.linear(x, w[p + "v_proj.weight"]).reshape(rows, kv_heads, hd)
        q = ops.rope(ops.rmsnorm(q, w[p + "q_norm.weight"], c.rms_norm_eps), positions, c.rotary_dim, c.rope_theta)
        k = ops.rope(ops.rmsnorm(k, w[p + "k_norm.weight"], c.rms_norm_eps), positions, c.rotary_dim, c.rope_theta)
        state.keys[i] = ops.append_rows(state.keys[i], state.length, k)
        state.values[i] = ops.append_rows(state.values[i], state.length, v)
        partial = ops.attention_partial(q, state.keys[i], state.values[i], positions + 1, 1.0 / math.sqrt(hd))
        out = ops.attention_merge(*partial).reshape(rows, heads * hd)
        return ops.linear(ops.sigmoid_mul(out, gate), w[p + "o_proj.weight"])
