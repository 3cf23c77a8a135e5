"""
The Qwen3.5 forward pass, twin by twin
======================================

In this tutorial you walk one prompt through a Qwen3.5 hybrid model by hand, calling the NumPy twins of
``tensorfold/cuda/`` one at a time, and arrive at the very bits that ``Model.logits`` computes.

You will learn about:

* the shape of a Qwen3.5 layer: a pre-norm residual block around a mixer (Gated DeltaNet or gated attention),
  then a pre-norm residual SwiGLU MLP;
* which twin computes which step: ``gemm_affine``, ``rmsnorm``, ``causal_conv``, ``l2norm``, ``deltanet_gates``,
  ``deltanet_scan``, ``rmsnorm_gated``, ``rope``, ``attention_partial`` and ``attention_merge``;
* why a whole prompt and a prompt followed by one-row steps give the same logits, bit for bit.

Run it with ``python tutorials/01_forward_pass.py``; it needs no GPU and no network, and takes a few seconds.
"""

# %%
# The default model
# -----------------
# tensorfold ships a tiny Qwen3.5 trained on Shakespeare's plays (`tensorfold/models/tiny-shakespeare`): eight
# layers (three DeltaNet layers, then one attention layer, twice), in MLX 4-bit. We load it on the NumPy backend,
# which runs the same twins that we are about to call by hand.
import math
import sys

import numpy as np

import tensorfold
from tensorfold.cuda.attention import attention_merge, attention_partial
from tensorfold.cuda.conv import causal_conv
from tensorfold.cuda.deltanet import deltanet_gates, deltanet_scan
from tensorfold.cuda.elementwise import silu_mul
from tensorfold.cuda.gemm import gemm_affine
from tensorfold.cuda.rmsnorm import l2norm, rmsnorm, rmsnorm_gated
from tensorfold.cuda.rope import rope
from tensorfold.models import DEFAULT_MODEL
from tensorfold.numerics.formats import affine_rows

model = tensorfold.load(DEFAULT_MODEL, backend="numpy")
c = model.config
w = model.net.weights  # canonical names -> Linear (matrices) or float32 arrays (norm multipliers, conv, gates)
print(f"layers: {c.layer_types}")
print(f"hidden {c.hidden_size}, vocab {c.vocab_size}, DeltaNet heads {c.linear_num_key_heads} q/k, "
      f"{c.linear_num_value_heads} v; attention heads {c.num_attention_heads} q, {c.num_key_value_heads} kv")

ids = model.tokenizer.encode("ROMEO: But soft, what light through yonder window breaks?")
positions = np.arange(len(ids))  # a fresh stream: the prompt starts at position 0
print(f"prompt: {len(ids)} tokens")


def check(ok, message):
    """Stop the script with a non-zero exit code when a check fails."""
    if not ok:
        sys.exit(f"CHECK FAILED: {message}")


shown = set()


def show(label, array):
    """Print an array's shape the first time a step runs (the three DeltaNet layers repeat the same steps)."""
    if label not in shown:
        shown.add(label)
        print(f"  {label:<34} {tuple(array.shape)}")


# %%
# Matrices go through the integer GEMM twin
# -----------------------------------------
# Every matrix product of the 4-bit model is `gemm_affine`: x is made integer per row and group of 64 columns
# (its fixed point under the group's largest value), the weights stay packed, eight codes to a uint32 word, and
# each group's sum of code times x is an exact integer; the groups' scales and biases are then applied in one fixed
# order (tutorial 02).


def linear(x, name):
    """x [rows, in] @ W.T for the matrix `name`, through the integer GEMM twin."""
    weight = w[name]
    check(weight.kind == "affine", f"{name} is {weight.kind}; the default model is 4-bit")
    return gemm_affine(x, weight.data, weight.scales, weight.biases, weight.bits, weight.group_size)


# %%
# Embedding
# ---------
# The embedding is a row lookup: no scaling, just the rows of `embed_tokens`, dequantized (only those rows).
e = w["embed_tokens.weight"]
h = affine_rows(e.data, e.scales, e.biases, e.bits, e.group_size, np.asarray(ids))  # [rows, hidden]
print("embedding")
show("h", h)

# %%
# A Gated DeltaNet layer
# ----------------------
# Four projections of the normed input: `in_proj_qkv` (q | k | v, head-major), `z` (the output gate), and the
# per-value-head `b` (write strength) and `a` (decay). The q | k | v channels then go through a causal depthwise
# convolution with SiLU; a fresh stream's conv tail is zeros. q and k are L2-normed per head (q also scaled by
# 1 / sqrt(dk)), the gates become a decay in (0, 1) and a write strength beta, and the scan runs the delta rule
# row by row from the (zero) recurrent state. A gated RMSNorm and `out_proj` bring the values back to hidden.
L2NORM_EPS = 1e-6  # Qwen3.5's q/k L2 norm has its own fixed eps


def deltanet_layer(x, i):
    p = f"layers.{i}.linear_attn."
    rows = x.shape[0]
    nk, nv, dk, dv = c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
    mixed = linear(x, p + "in_proj_qkv.weight")
    z = linear(x, p + "in_proj_z.weight").reshape(rows, nv, dv)
    b = linear(x, p + "in_proj_b.weight")
    a = linear(x, p + "in_proj_a.weight")
    show("in_proj_qkv -> q | k | v", mixed)
    tail = np.zeros((c.linear_conv_kernel_dim - 1, c.conv_dim), np.float32)  # a fresh stream's conv history
    mixed, tail = causal_conv(mixed, tail, w[p + "conv1d.weight"])
    show("conv1d weight [C, K]", w[p + "conv1d.weight"])
    q = l2norm(mixed[:, :nk * dk].reshape(rows, nk, dk), L2NORM_EPS, scale=1.0 / math.sqrt(dk))
    k = l2norm(mixed[:, nk * dk:2 * nk * dk].reshape(rows, nk, dk), L2NORM_EPS)
    v = mixed[:, 2 * nk * dk:].reshape(rows, nv, dv)
    show("q, k (L2-normed)", q)
    show("v", v)
    decay, beta = deltanet_gates(b, a, w[p + "A_log"], w[p + "dt_bias"])
    show("decay, beta", decay)
    state = np.zeros((nv, dk, dv), np.float32)  # a fresh stream's recurrent state
    out, state, log = deltanet_scan(state, q, k, v, decay, beta)
    show("scan out", out)
    show("state after the last row", state)
    y = rmsnorm_gated(out, z, w[p + "norm.weight"], c.rms_norm_eps)
    return linear(y.reshape(rows, nv * dv), p + "out_proj.weight")


# %%
# A gated attention layer
# -----------------------
# `q_proj` gives twice the query width: per head, the query and then an output gate. q and k get a per-head
# RMSNorm, then RoPE on their first `rotary_dim` dims. Attention runs as partials over fixed 128-key chunks and a
# merge; the keys a row reads are positions 0 .. p (causal). The merge gates the result by sigmoid(gate), and
# `o_proj` follows.


def attention_layer(x, i):
    p = f"layers.{i}.self_attn."
    rows, heads, kv_heads, hd = x.shape[0], c.num_attention_heads, c.num_key_value_heads, c.head_dim
    q_and_gate = linear(x, p + "q_proj.weight").reshape(rows, heads, 2 * hd)
    q = q_and_gate[:, :, :hd]  # the merge reads each head's second half, the gate, from q_and_gate itself
    k = linear(x, p + "k_proj.weight").reshape(rows, kv_heads, hd)
    v = linear(x, p + "v_proj.weight").reshape(rows, kv_heads, hd)
    show("q (per head: query | gate)", q_and_gate)
    show("k, v", k)
    q = rope(rmsnorm(q, w[p + "q_norm.weight"], c.rms_norm_eps), positions, c.rotary_dim, c.rope_theta)
    k = rope(rmsnorm(k, w[p + "k_norm.weight"], c.rms_norm_eps), positions, c.rotary_dim, c.rope_theta)
    m, l, o = attention_partial(q, k, v, positions + 1, 1.0 / math.sqrt(hd))
    show("partial m, l [rows, heads, chunks]", m)
    show("partial o", o)
    out = attention_merge(m, l, o, q_and_gate).reshape(rows, heads * hd)
    show("merged and gated", out)
    return linear(out, p + "o_proj.weight")


# %%
# The MLP
# -------
# SwiGLU: down(SiLU(gate(x)) * up(x)). (The engine stacks gate and up in one weight and runs them as one GEMV
# that writes the product itself: `gemv.swiglu` and tutorial 02.)


def mlp(x, p):
    gate = linear(x, p + "gate_proj.weight")
    up = linear(x, p + "up_proj.weight")
    show("gate, up", gate)
    return linear(silu_mul(gate, up), p + "down_proj.weight")


# %%
# All layers, then the head
# -------------------------
# Each layer is two pre-norm residual blocks. The norm weights were turned into multipliers by the loader
# (`1 + w` for Qwen3.5's centred norms), so `rmsnorm` only multiplies. A final norm and the head give the logits;
# this model ties its head to the embedding, so the head is `embed_tokens` used as a matrix.
for i, kind in enumerate(c.layer_types):
    p = f"layers.{i}."
    print(f"layer {i}: {kind}")
    x = rmsnorm(h, w[p + "input_layernorm.weight"], c.rms_norm_eps)
    h = h + (deltanet_layer(x, i) if kind == "linear_attention" else attention_layer(x, i))
    x = rmsnorm(h, w[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
    h = h + mlp(x, p + "mlp.")
head = "embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"
logits = linear(rmsnorm(h, w["norm.weight"], c.rms_norm_eps), head)
print("head")
show("logits", logits)

# %%
# The same bits as the model
# --------------------------
# The hand-made pass called the same twins, in the same order, as `Qwen35.forward`: the logits must be equal bit
# for bit, not merely close.
reference = model.logits(ids)
check(np.array_equal(logits, reference),
      f"hand-computed logits differ from model.logits: max |diff| {np.abs(logits - reference).max():.3g}")
print("hand-computed logits == model.logits(ids), bit for bit")

# %%
# A prompt pass, then one-row steps
# ---------------------------------
# Generation runs the prompt first, then one row per new token, continuing a `StreamState` (the stream's
# DeltaNet states, conv tails and attention keys and values). Every twin's reduction order for one row depends
# only on that row's own history (the GEMV's column stride and tree, the DeltaNet scan's row order, attention's
# fixed key chunks), never on how many rows run beside it. So the logits of the steps equal those of the whole
# prompt, bit for bit.
state = model.net.new_state()
split = 4
pieces = [model.net.forward(ids[:split], state)]  # the first `split` tokens as one pass
for token in ids[split:]:
    pieces.append(model.net.forward([token], state))  # then one row at a time
stepped = np.concatenate(pieces)
print(f"stream after {state.length} rows: {state.nbytes} bytes of cache")
check(np.array_equal(stepped, reference),
      f"one-row steps differ from the whole prompt: max |diff| {np.abs(stepped - reference).max():.3g}")
print(f"prompt of {split} rows + {len(ids) - split} one-row steps == whole prompt, bit for bit")

