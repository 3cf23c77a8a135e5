"""The operations a backend offers the model, written down: `Ops`, which both backends implement with the same
parameters (tests/test_backends.py checks it), and `DeviceOps`, what a backend that records CUDA graphs adds.

Arrays are float32 unless a line says otherwise, and are the backend's own (NumPy arrays, or numba device arrays);
"host" means a NumPy array whatever the backend. `Linear` is a weight in any of its forms (tensorfold/model/
checkpoint.py): f32, bf16 or MLX affine, `out_features` rows of `in_features`. Shapes name rows (of the round),
heads (query heads Hq, key/value heads Hkv, DeltaNet key heads nk and value heads nv), head widths (hd, dk, dv),
the conv's channels C and width K, and the vocabulary V.
"""
from typing import Protocol


class Ops(Protocol):
    """What the model, the engine and the drafters call on a backend."""

    name: str  # "numpy" or "cuda": for display, never to decide behaviour
    can_record: bool  # whether its launches can be recorded as CUDA graphs and replayed (tensorfold/device/graphs.py)
    on_device: bool  # whether its arrays live in a GPU's memory (or the simulator's) and its work queues on a stream

    # --- projections ----------------------------------------------------------------------------------------------

    def linear(self, x, weight):
        """x [rows, in] @ weight.T for a Linear weight [out, in]: [rows, out]."""

    def linear_parts(self, x, weight, widths):
        """linear(x, weight) cut into contiguous arrays [rows, width] of `widths` columns, left to right."""

    def swiglu(self, x, weight):
        """SiLU(x @ gate.T) * (x @ up.T) [rows, n] for a Linear [2 n, in] of n gate rows, then n up rows."""

    def embed(self, ids, weight):
        """The rows `ids` (int32 [rows]) of an embedding Linear [V, hidden]: [rows, hidden]."""

    # --- norms and elementwise ------------------------------------------------------------------------------------

    def rmsnorm(self, x, multiplier, eps):
        """x [..., width] RMS-normalised over its last axis and times multiplier [width]."""

    def add_rmsnorm(self, h, delta, multiplier, eps):
        """(h + delta, rmsnorm(h + delta)) for h, delta [rows, hidden]: the residual add and the norm after it."""

    def rmsnorm_gated(self, x, z, multiplier, eps):
        """rmsnorm(x) * SiLU(z) over the last axis, for x, z [rows, nv, dv] and multiplier [dv]."""

    def add(self, a, b):
        """a + b, elementwise, for arrays of one shape."""

    def silu_mul(self, gate, up):
        """SiLU(gate) * up, elementwise, for arrays of one shape."""

    # --- Gated DeltaNet -------------------------------------------------------------------------------------------

    def causal_conv(self, inputs, tail, weight, taps=None, out=None, in_place=False):
        """(out [rows, C], new tail [K - 1, C]) of the causal conv of inputs [rows, C] after tail [K - 1, C], weight
        [C, K], taps int32 [rows, K] (a chain's by default); written into `out`, and `in_place` over `tail`."""

    def scan_inputs(self, conv, b, a, a_log, dt_bias, heads, dk, eps, q_scale):
        """(q, k [rows, heads, dk] L2-normed, q times q_scale; v [rows, C - 2 heads dk]; decay, beta [rows, nv]) from
        the conv output [rows, C] and the gate projections b, a [rows, nv]."""

    def deltanet_scan(self, state, q, k, v, decay, beta, depths=None, path_slots=None, out=None, in_place=False):
        """(out [rows, nv, dv], state after the last row [nv, dk, dv], log (decay, delta, key)) of the gated delta
        rule from state over a window's rows, a chain or the tree of depths [rows] and path_slots [rows, deepest + 1];
        written into `out`, and `in_place` over `state`."""

    def deltanet_apply(self, state, log, path):
        """The state [nv, dk, dv] after replaying the logged rows `path` (in order) from `state`."""

    # --- attention ------------------------------------------------------------------------------------------------

    def rope(self, x, positions, rotary_dim, theta):
        """x [rows, heads, hd] rotated at each row's position (int32 [rows]); dims >= rotary_dim pass through."""

    def norm_rope(self, q_and_gate, k, q_multiplier, k_multiplier, eps, positions, rotary_dim, theta):
        """(q [rows, Hq, hd], k [rows, Hkv, hd]): the query half of q_and_gate [rows, Hq, 2 hd] and k, each head
        RMS-normed with its multiplier [hd], then rotated at its row's position (int32 [rows])."""

    def attention_partial(self, q, keys, values, n_keys, scale, committed=None, path_slots=None, max_keys=None):
        """(m, l [rows, Hq, chunks], o [rows, Hq, chunks, hd]): chunk partials of q [rows, Hq, hd] over the first
        n_keys[r] keys of the cache keys, values [N, Hkv, hd] (past `committed`, along path_slots); chunks enough for
        `max_keys` keys."""

    def attention_merge(self, m, l, o, out=None, gate=None):
        """out [rows, Hq, hd]: the partials merged in chunk order, times sigmoid(gate [rows, Hq, hd]) if given."""

    def kv_write(self, keys, values, new_keys, new_values, at):
        """Write new_keys, new_values [rows, Hkv, hd] into the cache keys, values [N, Hkv, hd] at rows at (int32
        [rows]), in place."""

    def kv_compact(self, keys, values, committed, path):
        """(keys, values) with a kept tree path's rows moved from committed + slot to committed + depth."""

    # --- sampling -------------------------------------------------------------------------------------------------

    def sample(self, logits, seed, position, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0):
        """The token id for output `position` from host logits [V]: argmax at temperature 0, else a seeded draw."""

    def sample_rows(self, logits, seeds, positions, temperature, top_k, top_p, min_p):
        """`sample` for every row of logits [rows, V] with per-row parameters (host [rows] each): host int32 [rows]."""

    def topk(self, logits, k):
        """(ids int32 [rows, k], log-softmax float32 [rows, k]), host arrays, of logits [rows, V], best first."""

    # --- memory ---------------------------------------------------------------------------------------------------

    def zeros(self, shape):
        """A new array of `shape`, zeros."""

    def empty(self, shape):
        """A new array of `shape`, its values unset (for outputs written part by part)."""

    def upload(self, host):
        """A host array, or a Linear of host arrays, as this backend's (uploaded once)."""

    def to_host(self, array):
        """The array as a host array (the NumPy backend's is the array itself)."""

    def concat_rows(self, arrays):
        """Arrays [rows_i, ...] of equal trailing shape stacked along their rows, as one new array."""

    def copy_into(self, dst, src):
        """Overwrite dst with src (the same shape), in place."""

    def reserve_rows(self, buffer, length, needed, limit=None):
        """`buffer` [N, ...] with room for `needed` rows, its first `length` kept: itself, or a grown copy (doubling,
        never past `limit` rows)."""

    def append_rows(self, buffer, length, rows, limit=None):
        """`buffer` [N, ...] with rows [n, ...] written at row `length`, grown as reserve_rows grows it."""

    # --- scheduling -----------------------------------------------------------------------------------------------

    def side_by_side(self, count: int):
        """Lanes (tensorfold/device/graphs.py) for work done once per window of `count`: side by side in a recording."""

    def synchronize(self):
        """Wait until the work queued so far has finished."""


class DeviceOps(Ops, Protocol):
    """What a backend that can record CUDA graphs (`can_record`) also has: the stream its launches go to, and what a
    recording needs beside it. The NumPy backend has none of these: its work runs as it is called, on the host."""

    cuda: object  # numba.cuda
    stream: object  # the numba stream every launch and copy is queued on (a lane swaps it for a side stream)
    pooled: bool  # whether device memory comes from tensorfold.device.pool

    def mapped(self, shape, dtype):
        """(host, device): one pinned host array of `shape` and `dtype` that launches read in place, as both views."""

    def side_streams(self, count: int) -> list:
        """`count` streams besides `stream`, the same ones each time (the lanes of a recording)."""
