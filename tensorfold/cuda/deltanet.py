"""Gated DeltaNet: the recurrence of Qwen3.5's linear-attention layers, as a scan that logs each row and an apply
that replays logged rows into a state.

For each row and value head h, with the state S [dk, dv] (fp32), the head's shared key/query k, q [dk] (already
L2-normalised), its value v [dv], decay `a = exp(g)` and write strength `beta`:

    S     = a * S                        decay
    m[j]  = sum_i S[i, j] * k[i]         read
    d[j]  = (v[j] - m[j]) * beta         delta: what this row writes
    S     = S + outer(k, d)              write
    o[j]  = sum_i S[i, j] * q[i]         output, from the updated state

The scan logs each row's (decay, delta, key). Replaying the log with `deltanet_apply` (decay, then write) rebuilds
the scan's states bit for bit, which is how a stream keeps the rows of a window it accepted.

Value head h reads query/key head `h // (nv / nk)`: consecutive value heads share one key head.

Mapping (the kernel): one thread per (value head h, column j): it holds column j of S in registers and walks i in
order for both sums, so every sum has one fixed order.
"""
import numpy as np

from .fmath import exp32, fma32, softplus32, sigmoid32


def deltanet_gates(b, a, a_log, dt_bias):
    """Per row and value head: (decay = exp(-exp(A_log) * softplus(a + dt_bias)), beta = sigmoid(b)), float32."""
    g = (-exp32.py_func(a_log) * softplus32.py_func(np.asarray(a, np.float32) + dt_bias)).astype(np.float32)
    return exp32.py_func(g), sigmoid32.py_func(b)


def _column_sum(state, vec):
    """m[h, j] = sum_i state[h, i, j] * vec[h, i], with i walked in order (one thread per (h, j))."""
    acc = np.zeros((state.shape[0], state.shape[2]), np.float32)
    for i in range(state.shape[1]):
        acc = fma32.py_func(state[:, i, :], vec[:, i, None], acc)
    return acc


def _decay_and_write(state, decay, key, delta):
    """S = decay * S, then S = S + outer(key, delta): the two state updates of one row."""
    state = state * decay[:, None, None]
    return fma32.py_func(key[:, :, None], delta[:, None, :], state)


def deltanet_scan(state, q, k, v, decay, beta):
    """Run the rows of a chain from `state` [nv, dk, dv].

    q, k [rows, nk, dk]; v [rows, nv, dv]; decay, beta [rows, nv]. Returns (out [rows, nv, dv], the state after the
    last row, log) where log = (decay [rows, nv], delta [rows, nv, dv], key [rows, nv, dk]).
    """
    nv = state.shape[0]
    share = nv // q.shape[1]  # value heads per key head
    q = np.repeat(np.asarray(q, np.float32), share, axis=1)
    k = np.repeat(np.asarray(k, np.float32), share, axis=1)
    rows = q.shape[0]
    out = np.empty((rows, nv, state.shape[2]), np.float32)
    deltas = np.empty_like(out)
    state = np.array(state, np.float32, copy=True)
    for r in range(rows):
        decayed = state * decay[r][:, None, None]
        read = _column_sum(decayed, k[r])
        deltas[r] = (v[r] - read) * beta[r][:, None]
        state = fma32.py_func(k[r][:, :, None], deltas[r][:, None, :], decayed)
        out[r] = _column_sum(state, q[r])
    return out, state, (np.array(decay, np.float32), deltas, k)


def deltanet_apply(state, log, path):
    """Replay the logged rows `path` (in order) into `state` [nv, dk, dv]: decay, then write, as the scan did."""
    decay, delta, key = log
    state = np.array(state, np.float32, copy=True)
    for r in path:
        state = _decay_and_write(state, decay[r], key[r], delta[r])
    return state
