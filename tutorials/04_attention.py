"""
Attention as chunk partials and a merge, and RoPE: fixed positions make rows independent
=========================================================================================

The full-attention layers of Qwen3.5 rotate queries and keys (RoPE), then let every query row attend to the keys
of its past. This tutorial reads the twins and the kernels of ``tensorfold/cuda/rope.py`` and
``tensorfold/cuda/attention.py`` side by side, runs the kernels under numba's CUDA simulator and checks that they
give the twins' bits.

You will learn about:

* RoPE's mapping (one thread per row, head and rotated pair) and why its cosines and sines are computed in
  float64 and rounded once to float32;
* attention as *partials* over chunks of CHUNK keys (a max, a sum and a weighted sum of values per chunk, with
  two fixed shared-memory trees) and a *merge* that rescales and adds the chunks in order;
* why the chunks sit at fixed logical positions (keys 0..127, 128..255, ...): a row's sums must not depend on
  which other rows run in the same round, so a prompt pass and one-row steps give the same bits;
* how a row that does not reach a chunk gets m = -inf, l = 0, o = 0 there, and why the merge skips such chunks.

Run it with ``python tutorials/04_attention.py`` (no GPU needed: it uses the simulator unless one is present).
"""

# %%
# The simulator must be chosen before numba.cuda is first imported. `show` prints a twin (left) beside its kernel
# (right), the lines that do the same work on the same row (tutorials/_side_by_side.py).
import inspect
import os
import sys

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

from _side_by_side import show  # noqa: E402
from tensorfold.cuda import attention, rope  # noqa: E402


def check(ok, message):
    if not ok:
        sys.exit(f"CHECK FAILED: {message}")
    print(f"ok: {message}")


rng = np.random.default_rng(0)

# %%
# RoPE: one thread per (row, head, pair)
# --------------------------------------
# Pair j of a head rotates (x[j], x[j + R/2]) by the angle position * theta ** (-2j / R); dims past the rotary dim
# R pass through. `rope_cos_sin` evaluates the angle, its cosine and its sine in float64 and rounds them to
# float32, and `rotate32` evaluates `a * cos + b * sin` in float64 (the products of float32 values are exact there)
# and rounds once. Both are device functions: the kernel calls them on one pair, the twin calls their `py_func`
# on whole arrays, so both sides run the very same expressions.
print(inspect.getsource(rope.rope_cos_sin.py_func))
print(inspect.getsource(rope.rotate32.py_func))
show(rope.rope, rope.rope_kernel,
     align=[("cos, sin = rope_table", "cos, sin = rope_cos_sin"),
            ("first, second = x", "first, second = x"),
            ("out[:, :, :half] = rotate32", "y[r, h, j] = rotate32"),
            ("out[:, :, half:rotary_dim]", "y[r, h, j + half]")])

rows, heads, head_dim, rotary_dim = 3, 2, 16, 8
x = rng.normal(size=(rows, heads, head_dim)).astype(np.float32)
positions = np.array([0, 7, 100000])
twin = rope.rope(x, positions, rotary_dim, 1e7)
kernel = rope.rope_launch(cuda.to_device(x), cuda.to_device(positions.astype(np.int32)), rotary_dim, 1e7)
check(twin.tobytes() == kernel.copy_to_host().tobytes(), "RoPE kernel == twin, bit for bit")
check(np.array_equal(twin[0], x[0]) and np.array_equal(twin[:, :, rotary_dim:], x[:, :, rotary_dim:]),
      "position 0 and the dims past the rotary dim are left as they are")

# %%
# Attention in two kernels
# ------------------------
# For a query row with n keys, split the keys into chunks [0, 128), [128, 256), ... The partial kernel runs one
# block per (row, query head, chunk), CHUNK = 128 threads:
#
# * thread t owns key slot t of the chunk: it walks the head dims in order with fma_rn for the score q . k, then
#   the block takes the chunk's max m in a halving tree (empty slots hold -inf) and, with p = exp(score - m), the
#   sum l in a second halving tree (empty slots hold 0), in the order of `fmath.tree_sum`;
# * then thread t owns head dims t, t + 128, ...: it walks the chunk's keys in order, o += p * v with fma_rn.
#
# The merge kernel runs one thread per (row, head, dim): M = max of the chunks' m, then for each chunk in order
# w = exp(m - M), L += l * w, O += o * w, and out = O / L. Query head h reads KV head h // (Hq / Hkv). The twin
# runs every block of a chunk at once: its loop over the chunks is the kernel's grid, so a chunk's pass faces one
# block's work, step by step.
show(attention.attention_partial, attention.attention_partial_kernel,
     align=[("for c in range(chunks)", "c, h, r, t = cuda.blockIdx"),
            ("for d in range(head_dim)", "if t < live:"),
            ("chunk_max = scores.max", "top[t] = score"),
            ("p = np.where(live", "p = np.float32(0)"),
            ("l[:, :, c] = tree_sum", "total[t] = p"),
            ("chunk_values = values[rows_read]", "sums = cuda.local.array")])
show(attention.attention_merge, attention.attention_merge_kernel,
     align=[("top = m.max", "top = np.float32(-np.inf)"),
            ("total = np.zeros", "total = np.float32(0)"),
            ("out = acc / total", "value = acc / total")])

# %%
# Run the kernels (simulated) and compare bits
# --------------------------------------------
# Two query heads share one KV head. Row 0 attends to 130 keys (a full chunk and 2 keys of the next); row 1 to 3
# keys, so it does not reach chunk 1: its partial there is m = -inf, l = 0, o = 0, which the merge ignores. The
# cache holds a few keys more than any row reads, as a grown KV cache does; they are never read.
q_heads, kv_heads, head_dim = 2, 1, 8
n_keys = np.array([130, 3])
q = rng.normal(size=(2, q_heads, head_dim)).astype(np.float32)
keys = rng.normal(size=(133, kv_heads, head_dim)).astype(np.float32)
values = rng.normal(size=(133, kv_heads, head_dim)).astype(np.float32)
scale = 1.0 / np.sqrt(head_dim)
on_device = [cuda.to_device(a) for a in (q, keys, values, n_keys.astype(np.int32))]

m, l, o = attention.attention_partial(q, keys, values, n_keys, scale)
partial = attention.attention_partial_launch(*on_device, scale, max_keys=int(n_keys.max()))
check(all(a.tobytes() == b.copy_to_host().tobytes() for a, b in zip((m, l, o), partial)),
      "partial kernel == twin, bit for bit (m, l and o)")
print(f"row 1, chunk 1: m = {m[1, :, 1]}, l = {l[1, :, 1]}, o all zero: {not o[1, :, 1].any()}")
out = attention.attention_merge(m, l, o)
check(out.tobytes() == attention.attention_merge_launch(*partial).copy_to_host().tobytes(),
      "merge kernel == twin, bit for bit")

share = q_heads // kv_heads
reference = np.empty(out.shape)
for r in range(2):
    for h in range(q_heads):
        s = keys[:n_keys[r], h // share].astype(np.float64) @ q[r, h] * scale
        p = np.exp(s - s.max())
        reference[r, h] = p @ values[:n_keys[r], h // share] / p.sum()
check(np.allclose(out, reference, rtol=1e-5, atol=1e-6), "and close to a float64 softmax(q k) v")

# %%
# Why the chunks sit at fixed positions
# -------------------------------------
# A row's chunk boundaries depend on nothing but its key index: chunk c is always keys [128 c, 128 (c + 1)).
# So row 1 gives the same bits whether it runs beside row 0 (a prompt) or alone (a decode step).
alone = attention.attention_merge_launch(*attention.attention_partial_launch(
    cuda.to_device(q[1:]), on_device[1], on_device[2], cuda.to_device(n_keys[1:].astype(np.int32)), scale,
    max_keys=3)).copy_to_host()
check(alone.tobytes() == out[1:].tobytes(), "a row alone == the same row beside another, bit for bit")

# Were the chunks cut relative to something else (the window of the round, say, so that a decode step used 64-key
# chunks), the same row would be summed in another order and its bits would change. The partial kernel takes the
# chunk width as an argument precisely so that the contract can plant this bug:
moved = attention.attention_merge_launch(*attention.attention_partial_launch(
    cuda.to_device(q[:1]), on_device[1], on_device[2], cuda.to_device(n_keys[:1].astype(np.int32)), scale,
    max_keys=130, chunk=64)).copy_to_host()
check(moved.tobytes() != out[:1].tobytes() and np.allclose(moved, out[:1], rtol=1e-5),
      "64-key chunks give other bits (close, but not equal): the boundaries must stay where they are")
