"""The operations a backend offers the model, written down: `Ops`, which both backends implement with the same
parameters (tests/test_backends.py checks it), and `DeviceOps`, what a backend that records CUDA graphs adds.

Arrays are float32 unless a line says otherwise, and are the backend's own (NumPy arrays, or numba device arrays);
"host" means a NumPy array whatever the backend. A `Linear` (tensorfold/model/checkpoint.py) is a weight [out, in]
in any of its forms. Shapes name the round's rows, the query heads Hq and key/value heads Hkv of attention (width
hd), the DeltaNet's key heads nk (width dk) and value heads nv (width dv), its conv's channels C and width K, and
the vocabulary V. Where a method takes `out`, its result is written into that array (a round's rows, window by
window); where it takes `in_place`, the new state or tail is written over the one it read (a recorded round, whose
replays must find it at the same address). A kept `path` is a host list of window rows, or on a device backend
int32 on the device that its first negative entry ends (`paths.until_end`: a recorded keep's).
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
        """linear(x, weight) cut left to right into contiguous arrays [rows, width], one for each of `widths`."""

    def swiglu(self, x, weight):
        """SiLU(x @ gate.T) * (x @ up.T) [rows, n] for a Linear [2 n, in] holding n gate rows, then n up rows."""

    def embed(self, ids, weight):
        """The rows `ids` (int32 [rows]) of an embedding Linear [V, hidden], dequantized: [rows, hidden]."""

    # --- norms and elementwise ------------------------------------------------------------------------------------

    def rmsnorm(self, x, multiplier, eps):
        """x [..., width] RMS-normalised over its last axis and times multiplier [width]."""

    def add_rmsnorm(self, h, delta, multiplier, eps):
        """(h + delta, rmsnorm(h + delta)) for h, delta [rows, hidden]: a residual add and the norm after it."""

    def rmsnorm_gated(self, x, z, multiplier, eps):
        """rmsnorm(x) * SiLU(z) over the last axis, for x, z [rows, nv, dv] and multiplier [dv]."""

    def add(self, a, b):
        """a + b, elementwise, for two arrays of one shape."""

    def silu_mul(self, gate, up):
        """SiLU(gate) * up, elementwise, for two arrays of one shape."""

    # --- Gated DeltaNet -------------------------------------------------------------------------------------------

    def causal_conv(self, inputs, tail, weight, taps=None, out=None, in_place=False):
        """(out [rows, C], new tail [K - 1, C]): inputs [rows, C] after tail, by weight [C, K], along taps [rows, K]."""

    def causal_conv_lanes(self, inputs, pool, lanes, weight, out):
        """Each window w's one row convolved after pool[lanes[w]], into out row w, its new tail written there."""

    def conv_tail_after(self, tail, inputs, path):
        """tail [K - 1, C] overwritten by the tail after keeping the window rows `path` of inputs [rows, C]."""

    def scan_inputs(self, conv, b, a, a_log, dt_bias, heads, dk, eps, q_scale):
        """(q, k [rows, heads, dk] L2-normed, v [rows, C - 2 heads dk], decay, beta [rows, nv]) from conv [rows, C]."""

    def deltanet_scan(self, state, q, k, v, decay, beta, depths=None, path_slots=None, out=None, in_place=False):
        """(out [rows, nv, dv], state after the last row [nv, dk, dv], log) of the gated delta rule, chain or tree."""

    def deltanet_scan_lanes(self, pool, lanes, q, k, v, decay, beta, out):
        """Each window w's one row scanned from pool[lanes[w]] and written over it, into out row w; returns the log."""

    def deltanet_apply(self, state, log, path, in_place=False):
        """The state [nv, dk, dv] after replaying the scan log's rows `path` (in order) from `state`."""

    # --- attention ------------------------------------------------------------------------------------------------

    def rope(self, x, positions, rotary_dim, theta):
        """x [rows, heads, hd] rotated at each row's position (int32 [rows]); dims >= rotary_dim pass through."""

    def norm_rope(self, q_and_gate, k, q_multiplier, k_multiplier, eps, positions, rotary_dim, theta):
        """(q [rows, Hq, hd], k [rows, Hkv, hd]): q_and_gate's query half and k, each head RMS-normed, then rotated."""

    def attention_partial(self, q, keys, values, n_keys, scale, committed=None, path_slots=None, max_keys=None):
        """(m, l [rows, Hq, chunks], o [rows, Hq, chunks, hd]): chunk partials of q [rows, Hq, hd] over n_keys keys."""

    def attention_merge(self, m, l, o, out=None, q_and_gate=None):
        """out [rows, Hq, hd]: the chunk partials merged, times sigmoid(gate), the gate half of q_and_gate's heads."""

    def kv_write(self, keys, values, new_keys, new_values, at):
        """new_keys, new_values [rows, Hkv, hd] written into the cache [N, Hkv, hd] at rows at (int32 [rows])."""

    def kv_compact(self, keys, values, committed, path):
        """(keys, values) [N, Hkv, hd] with a kept tree path's rows moved from committed + slot to committed + depth."""

    # --- the sparse MoE block (tensorfold/cuda/moe.py) -------------------------------------------------------------

    def route(self, logits, k):
        """(ids int32, weights [rows, k]): each row's k likeliest experts of logits [rows, E], weights summing to 1."""

    def routed_experts(self, x, ids, experts):
        """[rows, k (+ 1: the shared expert, if `experts.shared`), hidden]: x's SwiGLU by each (row, rank)'s expert."""

    # one call, so that a device backend may route a round's rows and group their pairs by expert in one launch
    def route_experts(self, x, logits, k, experts):
        """(routed_experts(x, ids, experts), weights) for (ids, weights) = route(logits, k), in one call."""

    def moe_combine(self, routed, weights, shared, gate_logit):
        """[rows, hidden]: routed [rows, k, hidden] by rank + shared (None: routed's rank k) * sigmoid(gate_logit)."""

    # --- sampling -------------------------------------------------------------------------------------------------

    def sample(self, logits, seed, position, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0):
        """The token id at output `position` from host logits [V]: argmax at temperature 0, else a seeded draw."""

    def sample_rows(self, logits, seeds, positions, temperature, top_k, top_p, min_p):
        """`sample` for each row of logits [rows, V], with host parameters [rows] each: host int32 [rows]."""

    def topk(self, logits, k):
        """(ids int32 [rows, k], log-softmax float32 [rows, k]) of logits [rows, V] on the host, best first."""

    # --- memory ---------------------------------------------------------------------------------------------------

    def zeros(self, shape):
        """A new array of `shape`, zeros."""

    def empty(self, shape):
        """A new array of `shape`, its values unset (an output written part by part)."""

    def upload(self, host):
        """A host array, or a Linear of host arrays, as this backend's (weights are uploaded once)."""

    def to_host(self, array):
        """The array as a host array."""

    def concat_rows(self, arrays):
        """Arrays [rows_i, ...] of one trailing shape stacked along their rows: one new array [sum rows_i, ...]."""

    def copy_into(self, dst, src):
        """Overwrite dst with src (the same shape), in place."""

    def reserve_rows(self, buffer, length, needed, limit=None):
        """`buffer` [N, ...] with room for `needed` rows and its first `length` kept: itself, or a grown copy."""

    def append_rows(self, buffer, length, rows, limit=None):
        """`buffer` [N, ...] with rows [n, ...] written from row `length` on, grown as reserve_rows grows it."""

    # --- scheduling -----------------------------------------------------------------------------------------------

    def side_by_side(self, count: int):
        """Lanes (device/graphs.py) for work done once per window of `count`: side by side in a recording."""

    def synchronize(self):
        """Wait until the work queued so far has finished."""


class DeviceOps(Ops, Protocol):
    """What a backend that can record CUDA graphs (`can_record`) also has: the stream its launches go to, and what a
    recording needs beside it. The NumPy backend has none of these: its work runs as it is called, on the host."""

    cuda: object  # numba.cuda
    stream: object  # the numba stream every launch and copy is queued on (a lane swaps in a side stream)
    pooled: bool  # whether device memory comes from tensorfold.device.pool

    def mapped(self, shape, dtype):
        """(host, device): one pinned host array of `shape`, `dtype` that launches read in place, in both views."""

    def side_streams(self, count: int) -> list:
        """`count` streams besides `stream`, the same ones each time (the lanes of a recording)."""

    def topk_on_device(self, logits, k):
        """`topk`'s (ids int32, log-softmax float32) [rows, k] of device logits, left on the device (no download)."""

    def draw_slots(self, rows: int):
        """`sample_rows`' parameters and tokens for `rows` rows in mapped host memory (`write`, then `tokens`)."""

    def draw_into(self, logits, slots) -> None:
        """Queue `sample_rows`' draws of device logits with the parameters in `slots`, the tokens into `slots`."""
