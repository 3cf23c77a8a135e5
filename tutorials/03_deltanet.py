"""
Gated DeltaNet: a scan that logs, an apply that replays
=======================================================

Qwen3.5's linear-attention layers keep, per value head, a state ``S`` of dk x dv floats and update it once per row
with the gated delta rule. This tutorial reads the twins and kernels of ``tensorfold/cuda/deltanet.py`` (and the
causal conv before them, ``tensorfold/cuda/conv.py``), runs the kernels under numba's CUDA simulator on tiny heads,
and checks every result against its twin bit for bit.

You will learn about:

* the gated delta rule: decay, read, delta, write, output, and the gates that turn two projections into a decay
  and a write strength;
* the mapping: a thread per (value head, column j, chain) that holds its chain's elements of column j of S for the
  whole window, so both sums walk i in one fixed order, their eight chains meeting once a sum;
* the log: why the scan writes each row's (decay, delta, key), and how ``deltanet_apply`` replays the rows a
  stream accepted out of a window to rebuild the scan's state bit for bit, with no read and no query;
* the causal conv's tail, which is how the same stream carries its last inputs from one window to the next.

Run it with ``python tutorials/03_deltanet.py`` (no GPU needed: it uses the simulator unless one is present).
"""

# %%
# The simulator must be chosen before numba.cuda is first imported. `show` prints a twin (left) beside its kernel
# (right), the lines that do the same work on the same row (tutorials/_side_by_side.py).
import os
import sys

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

from _side_by_side import show  # noqa: E402
from tensorfold.cuda import conv, deltanet  # noqa: E402
from tensorfold.cuda.rmsnorm import l2norm  # noqa: E402


def check(ok, message):
    if not ok:
        sys.exit(f"CHECK FAILED: {message}")
    print(f"ok: {message}")


def same(a, b):
    """Byte equality of two arrays, or of two tuples of arrays."""
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return np.asarray(a).shape == np.asarray(b).shape and np.asarray(a).tobytes() == np.asarray(b).tobytes()


def host(arrays):
    """Device arrays (or nested tuples of them) copied back."""
    if isinstance(arrays, tuple):
        return tuple(host(a) for a in arrays)
    return arrays.copy_to_host()


# %%
# The rule, and who computes what
# -------------------------------
# For each row and value head h, with the shared (L2-normalised) key and query k, q [dk], the value v [dv], the
# decay a in (0, 1] and the write strength beta in (0, 1):
#
#     S     = a * S                      decay
#     m[j]  = sum_i S[i, j] * k[i]       read: what S already answers for the key k
#     d[j]  = (v[j] - m[j]) * beta       delta: the correction this row writes
#     S     = S + outer(k, d)            write
#     o[j]  = sum_i S[i, j] * q[i]       output, from the updated state
#
# Every step touches one column j of S at a time: m[j], d[j] and o[j] need column j and nothing else. Each sum runs as
# SUM_CHAINS interleaved chains (chain c takes i = c, c + 8, ... in order) added up in a fixed tree at the end
# (`chains_total`): a chain of 128 multiply-adds would wait on each result in turn, eight chains of 16 do not. So each
# (h, j, chain c) has a thread: it keeps its chain's elements of column j in a local array for the whole window, walks
# them in order for both sums, and trades its chain with the column's seven others, its neighbouring lanes of the warp,
# by shuffles (`column_total`): each of the eight adds them in the tree and so holds the same total (a lane whose
# partner's half comes first adds the two the other way round, the same bits). The columns of a head share the rows'
# keys and queries, which a block stages in shared memory a tile of ROWS_STAGED rows at a time, beside the rows' values,
# decays and betas (`scan_kernel` builds the kernel for one dk): a tile changes when the inputs are loaded, not what is
# computed from them. The twin runs the same loop over i, vectorised over (h, j). Value head h reads key head h // (nv /
# nk): consecutive value heads share a key head. Row by row, the twin's steps face the kernel's: decay and read, delta,
# write and output.
show([deltanet.deltanet_scan, deltanet._column_sum], deltanet.scan_kernel,
     align=[("for r in range(rows)", "for u in range(min(ROWS_STAGED"),
            ("decayed = state", "a = decays[u]"),
            ("deltas[r] = ", "delta = (values[u, column]"),
            ("state = fma_rn_twin(k[r]", "# write, then output"),
            ("return out, state", "if cuda.blockIdx.x == logger")])

# %%
# The gates
# ---------
# Two projections per row and value head become the decay and the write strength: decay = exp(g) with
# g = -exp(A_log) * softplus(a + dt_bias) <= 0, and beta = sigmoid(b). Elementwise, and on the device part of
# the launch that takes everything the scan reads out of the conv output (`scan_inputs`): its last block per row
# copies v and computes the gates, one thread per value head. The transcendentals go through fmath, which
# evaluates them in float64 and rounds once, the same everywhere.
show([deltanet.scan_inputs, deltanet.deltanet_gates], deltanet.scan_inputs_kernel,
     align=[("q = l2norm", "if slot < 2 * heads"),
            ("return (q, k", "for i in range(t, v.shape[1]"),
            ("g = (-exp32_twin", "g = -exp32(a_log")])

rng = np.random.default_rng(0)
rows, nv, nk, dk, dv = 6, 4, 2, 8, 6
b = rng.normal(size=(rows, nv)).astype(np.float32)
a = (4 * rng.normal(size=(rows, nv))).astype(np.float32)
a_log, dt_bias = rng.normal(size=nv).astype(np.float32), rng.normal(size=nv).astype(np.float32)
decay, beta = deltanet.deltanet_gates(b, a, a_log, dt_bias)
conv_out = rng.normal(size=(rows, 2 * nk * dk + nv * dv)).astype(np.float32)
want = deltanet.scan_inputs(conv_out, b, a, a_log, dt_bias, nk, dk, 1e-6, dk ** -0.5)
got = host(deltanet.scan_inputs_launch(*(cuda.to_device(x) for x in (conv_out, b, a, a_log, dt_bias)), nk, dk, 1e-6,
                                       dk ** -0.5))
check(same(got, want) and same(want[3:], (decay, beta)), "q, k, v and the gates: kernel == twin, bit for bit")
check(bool((decay > 0).all() and (decay <= 1).all()), "every decay lies in (0, 1]")

# %%
# Run the scan (simulated) and compare bits
# -----------------------------------------
# The scan returns the outputs, the state after the last row, and the log. We check all three against the twin,
# and the numbers against the rule written in float64.
state = (0.1 * rng.normal(size=(nv, dk, dv))).astype(np.float32)
q = l2norm(rng.normal(size=(rows, nk, dk)).astype(np.float32), 1e-6, scale=dk ** -0.5)
k = l2norm(rng.normal(size=(rows, nk, dk)).astype(np.float32), 1e-6)
v = rng.normal(size=(rows, nv, dv)).astype(np.float32)
inputs = (state, q, k, v, decay, beta)

out, final, log = deltanet.deltanet_scan(*inputs)
k_out, k_final, k_log = host(deltanet.deltanet_scan_launch(*(cuda.to_device(x) for x in inputs)))
check(same(k_out, out), "scan kernel outputs == twin, bit for bit")
check(same(k_final, final), "scan kernel final state == twin, bit for bit")
check(same(k_log, log), "scan kernel log (decay, delta, key) == twin, bit for bit")

s, o = state.astype(np.float64), np.empty((rows, nv, dv))
for r in range(rows):
    for h in range(nv):
        kh, qh = k[r, h // (nv // nk)].astype(np.float64), q[r, h // (nv // nk)].astype(np.float64)
        s[h] *= decay[r, h]
        s[h] += np.outer(kh, (v[r, h] - s[h].T @ kh) * beta[r, h])
        o[r, h] = s[h].T @ qh
check(np.allclose(out, o, rtol=1e-4, atol=1e-5) and np.allclose(final, s, rtol=1e-4, atol=1e-5),
      "outputs and final state close to the rule in float64")

# %%
# Why a log: a stream keeps the rows of a window it accepted
# ----------------------------------------------------------
# A stream may run a window of rows that it does not keep whole: draft tokens, say, of which only the first few
# turn out to be right. Attention layers simply forget the rejected rows' keys; a DeltaNet layer has folded every
# row into S. Saving S after every row would cost dk x dv floats per head per row. The scan instead logs, per row
# and head, the decay, the delta column d and the key: dv + dk + 1 floats. Replaying the accepted rows of the log
# into the state from before the window is all that is needed, because the delta already holds what the read
# found: the apply only decays and writes, S = fma_rn(k, d, a * S), exactly the scan's two state updates. With no
# sum left, every element of S is a chain of its own: the kernel gives each element a thread of its own.
show([deltanet.deltanet_apply, deltanet._decay_and_write], deltanet.deltanet_apply_kernel,
     align=[("for r in path", "for p in range(path.shape[0])"),
            ("def _decay_and_write", "s = fma_rn(")])

accepted = 4  # of the window's 6 rows, the stream keeps the first 4
path = list(range(accepted))
kept, kept_state, _ = deltanet.deltanet_scan(state, *(x[:accepted] for x in (q, k, v, decay, beta)))
replayed = deltanet.deltanet_apply(state, log, path)
check(same(replayed, kept_state), "twin: replaying the accepted rows == scanning only those rows, bit for bit")
check(same(out[:accepted], kept), "and the window's first rows gave the same outputs as those rows alone")

device_log = tuple(cuda.to_device(x) for x in log)
k_replayed = deltanet.deltanet_apply_launch(cuda.to_device(state), device_log, path).copy_to_host()
check(same(k_replayed, replayed), "apply kernel == twin, bit for bit")
k_all = deltanet.deltanet_apply_launch(cuda.to_device(state), device_log, range(rows)).copy_to_host()
check(same(k_all, final), "apply kernel over the whole window == the scan's final state")

# %%
# The controls: a replay that is off by one row is red
# ----------------------------------------------------
# A check that cannot fail proves nothing. Plant the two bugs an apply can have, a dropped row and two rows in
# the wrong order; both must change the bits. (The kernel contract, `tensorfold contract`, plants these too.)
dropped = path[:1] + path[2:]
swapped = [path[1], path[0]] + path[2:]
for label, bad in (("a dropped row", dropped), ("two swapped rows", swapped)):
    planted = deltanet.deltanet_apply_launch(cuda.to_device(state), device_log, bad).copy_to_host()
    check(not same(planted, kept_state), f"control '{label}' turns the replay red")

# %%
# The causal conv and its tail
# ----------------------------
# Before the scan, q, k and v come out of a depthwise causal conv with K = 4 taps and SiLU. Row r of a window
# reads rows r - 3 .. r, so the first rows reach back into the stream's tail: its last K - 1 raw inputs. The
# kernel is one thread per (row, channel) walking the taps in order with fma32; K - 1 more rows of threads copy
# the new tail, the last K - 1 rows of [tail; inputs] (a one-row window in a recorded decode round shifts its tail
# in place instead: its thread for a channel is the only one that reads it). A window split in two gives the same
# bits as one window.
show(conv.causal_conv, [conv.history_at, conv.causal_conv_kernel],
     align=[("for j in range(kernel)", "for j in range(kernel)"),
            ("return silu32_twin", "out[r, c] = silu32")])

channels = 5
u = rng.normal(size=(rows, channels)).astype(np.float32)
tail = rng.normal(size=(3, channels)).astype(np.float32)
weight = (0.5 * rng.normal(size=(channels, 4))).astype(np.float32)
mixed, new_tail = conv.causal_conv(u, tail, weight)
got = host(conv.causal_conv_launch(cuda.to_device(u), cuda.to_device(tail), cuda.to_device(weight)))
check(same(got, (mixed, new_tail)), "conv kernel (outputs, new tail) == twin, bit for bit")
first, mid_tail = host(conv.causal_conv_launch(cuda.to_device(u[:2]), cuda.to_device(tail), cuda.to_device(weight)))
second, end_tail = host(conv.causal_conv_launch(cuda.to_device(u[2:]), cuda.to_device(mid_tail),
                                                cuda.to_device(weight)))
check(same(np.concatenate([first, second]), mixed) and same(end_tail, new_tail),
      "a window of 2 rows, then one of 4 through the tail == one window of 6")
print("all checks passed")
