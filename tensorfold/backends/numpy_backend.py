"""The NumPy backend: the twins of tensorfold/cuda/, one method per kernel family, on any machine.

Every method returns host NumPy arrays and has finished when it returns; the `cuda` backend's kernels compute the
same bits (tests/test_twins.py, tests/test_contract.py).
"""
import weakref

import numpy as np

from tensorfold.cuda import attention, conv, deltanet, elementwise, gemm, gemv, kv, moe, sampling
from tensorfold.cuda import rmsnorm as norm
from tensorfold.cuda import rope as rotary
from tensorfold.cuda import topk as top_k
from tensorfold.cuda.experts import routed_experts
from tensorfold.device import graphs


def grown_rows(current: int, needed: int, limit: int | None) -> int:
    """The new row capacity of a full cache buffer: double it (fewer copies), but stay within `limit`."""
    rows = max(needed, 2 * current)
    return max(needed, min(rows, limit)) if limit else rows


class NumpyBackend:
    """The NumPy twins, one method per kernel family (the operations of ops.Ops)."""

    name = "numpy"
    can_record = False  # its work runs as it is called: there is no stream to record
    on_device = False
    WALKED_BUDGET = 256 << 20  # bytes of weights kept in the GEMV twin's walk order (float64), per backend

    def __init__(self):
        self.walked_weights = {}  # id(Linear) -> (a weak reference to it, the arrays it was made of, its walked copy)
        self.walked_bytes = 0

    def linear(self, x, weight):
        """x [rows, in] @ weight.T for a `Linear` in any of its forms: exact integer sums for affine weights (gemm.py),
        the float32 walk for the others (gemv.py)."""
        if weight.kind == "affine":
            return gemm.gemm_affine(x, weight.data, weight.scales, weight.biases, weight.bits, weight.group_size)
        walked = self.walked(weight)
        if walked is not None:  # the same twin on the same values, without dequantizing and reordering them again
            return gemv.gemv(x, weight.rows, weight.out_features, walked)
        if weight.kind == "bf16":
            return gemv.gemv_bf16(x, weight.data)
        return gemv.gemv_f32(x, weight.data)

    def walked(self, weight):
        """The weight in the GEMV twin's walk order (`gemv.walked_weight`), made on first use and kept while the
        weight lives, as long as the kept weights fit WALKED_BUDGET; None past it. A weight given new arrays (its
        `data`, `scales` or `biases` replaced) gets a new copy; writes into its arrays after its first use here
        are not seen (a loaded checkpoint's never change)."""
        arrays = (weight.data, weight.scales, weight.biases)
        kept = self.walked_weights.get(id(weight))
        if kept is not None and kept[0]() is weight and all(a is b for a, b in zip(kept[1], arrays)):
            return kept[2]
        self.forget_walked(id(weight))
        nbytes = 8 * weight.out_features * weight.in_features
        if self.walked_bytes + nbytes > self.WALKED_BUDGET:
            return None
        walked = gemv.walked_weight(weight.rows, weight.out_features, weight.in_features)
        gone = lambda _, key=id(weight): self.forget_walked(key)  # noqa: E731 (the weight is gone: so is its copy)
        self.walked_weights[id(weight)] = (weakref.ref(weight, gone), arrays, walked)
        self.walked_bytes += nbytes
        return walked

    def forget_walked(self, key) -> None:
        """Drop the walked copy kept under `key`, if any."""
        kept = self.walked_weights.pop(key, None)
        if kept is not None:
            self.walked_bytes -= kept[2].nbytes

    def embed(self, ids, weight):
        return weight.rows(ids)

    def causal_conv(self, inputs, tail, weight, taps=None, out=None, in_place=False):
        """The twin; with `out`, its rows written there; `in_place`, the new tail written over `tail`."""
        rows, new_tail = conv.causal_conv(inputs, tail, weight, taps)
        return written(out, rows), written(tail if in_place else None, new_tail)

    def causal_conv_lanes(self, inputs, pool, lanes, weight, out):
        """The twin; its rows written into `out`, the lanes' new tails over their rows of `pool`."""
        rows, pool[...] = conv.causal_conv_lanes(inputs, pool, lanes, weight)
        return written(out, rows)

    def deltanet_scan(self, state, q, k, v, decay, beta, depths=None, path_slots=None, out=None, in_place=False):
        """The twin; with `out`, its rows written there; `in_place`, the new state written over `state`."""
        rows, after, log = deltanet.deltanet_scan(state, q, k, v, decay, beta, depths, path_slots)
        return written(out, rows), written(state if in_place else None, after), log

    def deltanet_scan_lanes(self, pool, lanes, q, k, v, decay, beta, out):
        """The twin; its rows written into `out`, the lanes' states over their rows of `pool`."""
        rows, pool[...], log = deltanet.deltanet_scan_lanes(pool, lanes, q, k, v, decay, beta)
        written(out, rows)
        return log

    def deltanet_apply(self, state, log, path, in_place=False):
        """The twin; `in_place`, the new state written over `state`."""
        return written(state if in_place else None, deltanet.deltanet_apply(state, log, path))

    def conv_tail_after(self, tail, inputs, path):
        """The twin, written over `tail`."""
        return written(tail, conv.conv_tail_after(tail, inputs, path))

    def attention_merge(self, m, l, o, out=None, q_and_gate=None):
        return written(out, attention.attention_merge(m, l, o, q_and_gate))

    def attention_partial(self, q, keys, values, n_keys, scale, committed=None, path_slots=None, max_keys=None):
        """The twin, whose partials always hold the chunks of the largest n_keys (chunks beyond them would change
        no merged bit: the merge skips a chunk no row reaches)."""
        return attention.attention_partial(q, keys, values, n_keys, scale, committed, path_slots)

    rmsnorm = staticmethod(norm.rmsnorm)
    add_rmsnorm = staticmethod(norm.add_rmsnorm)
    rmsnorm_gated = staticmethod(norm.rmsnorm_gated)
    scan_inputs = staticmethod(deltanet.scan_inputs)
    rope = staticmethod(rotary.rope)
    norm_rope = staticmethod(rotary.norm_rope)
    kv_compact = staticmethod(kv.kv_compact)
    kv_write = staticmethod(kv.kv_write)
    add = staticmethod(elementwise.add)
    silu_mul = staticmethod(elementwise.silu_mul)
    sample = staticmethod(sampling.sample)
    sample_rows = staticmethod(sampling.sample_rows)
    route = staticmethod(moe.route)
    moe_combine = staticmethod(moe.combine)

    def routed_experts(self, x, ids, experts):
        """The grouped twin: each expert's rows through this backend's `linear` together (experts.routed_experts)."""
        return routed_experts(x, ids, experts.gate_up_views, experts.down_views, self.linear, experts.shared)

    def route_experts(self, x, logits, k, experts):
        ids, weights = self.route(logits, k)
        return self.routed_experts(x, ids, experts), weights

    def side_by_side(self, count: int):
        """Lanes for work that runs once per window: on NumPy, one after another, as written."""
        return graphs.Lanes(self, count)

    def zeros(self, shape):
        return np.zeros(shape, np.float32)

    def empty(self, shape):
        return np.empty(shape, np.float32)

    def upload(self, host):
        """A host array (or Linear) as this backend's (NumPy: the thing itself)."""
        return host

    def reserve_rows(self, buffer, length, needed, limit=None):
        """`buffer` with room for `needed` rows, of which the first `length` are kept: itself, or a grown copy
        (doubling, but never past `limit` rows when given)."""
        if needed <= len(buffer):
            return buffer
        grown = np.zeros((grown_rows(len(buffer), needed, limit),) + buffer.shape[1:], buffer.dtype)
        grown[:length] = buffer[:length]
        return grown

    def append_rows(self, buffer, length, rows, limit=None):
        """Write `rows` at `buffer[length:]`, growing the buffer when full (see reserve_rows); returns the buffer."""
        buffer = self.reserve_rows(buffer, length, length + len(rows), limit)
        buffer[length:length + len(rows)] = rows
        return buffer

    def copy_into(self, dst, src):
        """Overwrite dst with src (same shape), in place."""
        dst[...] = src

    def synchronize(self):
        """Wait for queued work: NumPy has none (every call has finished when it returns)."""

    def concat_rows(self, arrays):
        """Arrays of equal trailing shape stacked along their rows, as one new array."""
        return np.concatenate(arrays)

    def linear_parts(self, x, weight, widths):
        """linear(x, weight) cut into arrays of `widths` columns, left to right (each its own contiguous array):
        the outputs of projections whose weights are stacked in `weight`."""
        bounds = np.cumsum([0] + list(widths))
        y = self.linear(x, weight)
        return [np.ascontiguousarray(y[:, a:b]) for a, b in zip(bounds[:-1], bounds[1:])]

    def swiglu(self, x, weight):
        """SiLU(x @ gate.T) * (x @ up.T) for a weight that stacks the gate's rows, then the up's (gemv.swiglu)."""
        return gemv.swiglu(self.linear(x, weight))

    def to_host(self, array) -> np.ndarray:
        return np.asarray(array)

    def topk(self, logits, k):
        """The k best ids of each row of logits [rows, V] and their log-softmax values: host arrays int32 and
        float32 [rows, k], best first (ties: the lower id first)."""
        return top_k.topk(logits, k)


def written(out, array):
    """`array`, or, when `out` is given, out with array's values written into it (the NumPy backend's `out=`)."""
    if out is None:
        return array
    out[...] = array
    return out
