"""The `cuda` backend: the kernels of tensorfold/cuda/ launched on one stream over numba device arrays.

Weights are uploaded once and every array is a device array. Under numba's CUDA simulator (`NUMBA_ENABLE_CUDASIM=1`)
the same backend runs the kernels on the CPU, which is how the test suite checks them without a GPU.
"""
import dataclasses
import os

import numpy as np
from numba.cuda.cudadrv.driver import device_memset  # under the simulator, its own form

from tensorfold.backends.numpy_backend import grown_rows
from tensorfold.cuda import attention, conv, deltanet, elementwise, gemm_launch, gemv, kv, moe, sampling
from tensorfold.cuda import rmsnorm as norm
from tensorfold.cuda import rope as rotary
from tensorfold.cuda import topk as top_k
from tensorfold.cuda import weights as stored  # the embedding kernels: weights read as stored
from tensorfold.cuda.experts import routed_experts_launch
from tensorfold.device import SIMULATED, graphs
from tensorfold.errors import BackendError


class CudaBackend:
    """The kernels, launched on one stream over numba device arrays (ops.Ops, and ops.DeviceOps for recordings)."""

    name = "cuda"
    can_record = True  # on a GPU by stream capture, in the simulator as a list of launches (device/graphs.py)
    on_device = True

    def __init__(self):
        from numba import cuda
        if not cuda.is_available():
            raise BackendError("backend 'cuda': no usable CUDA GPU here (numba.cuda.is_available() is False); "
                               "use backend 'numpy'")
        self.cuda = cuda
        self.pooled = False  # whether device memory comes from tensorfold.device.pool (a real GPU, a fresh context)
        if not SIMULATED and os.environ.get("TENSORFOLD_DEVICE_POOL", "1") != "0":
            from tensorfold.device import pool as device_pool
            self.pooled = device_pool.install()
        self.stream = cuda.stream()
        self._side_streams = []  # for graphs.Lanes, made on first use
        self._draw_slots = {}  # rows -> DrawSlots: one set per round size seen (at most parallel x 16 rows)

    def side_by_side(self, count: int):
        """Lanes for work that runs once per window (tensorfold/device/graphs.py): side by side in a recording."""
        return graphs.Lanes(self, count)

    def side_streams(self, count: int) -> list:
        """`count` streams besides the backend's own, the same ones each time."""
        while len(self._side_streams) < count:
            self._side_streams.append(self.cuda.stream())
        return self._side_streams[:count]

    def _device(self, array):
        """A host array's copy on the device; a device array as it is."""
        if not isinstance(array, (np.ndarray, np.generic, list, tuple)):
            return array
        graphs.refuse("an upload")
        return self.cuda.to_device(np.ascontiguousarray(array), stream=self.stream)

    def upload(self, host):
        """Weights go to the device once: a Linear's arrays, or a plain array."""
        if isinstance(host, np.ndarray):
            return self._device(host)
        parts = {f: self._device(getattr(host, f)) for f in ("data", "scales", "biases")
                 if getattr(host, f) is not None}
        return dataclasses.replace(host, **parts)

    def zeros(self, shape):
        """A new device array of zeros, filled on the device (a prompt's fresh states: no host copy to wait for)."""
        if SIMULATED:  # the simulator's memset fills through NumPy methods a GPU's device array lacks (and tests')
            return self._device(np.zeros(shape, np.float32))
        array = self.cuda.device_array(shape, np.float32, stream=self.stream)
        if array.size:
            device_memset(array, 0, array.nbytes, stream=self.stream)
        return array

    def empty(self, shape):
        """A new device array, its values unset (for outputs the windows of a round write part by part)."""
        return self.cuda.device_array(shape, np.float32, stream=self.stream)

    def to_host(self, array) -> np.ndarray:
        graphs.refuse("a copy to the host")
        return array.copy_to_host(stream=self.stream)

    def concat_rows(self, arrays):
        """Arrays of equal trailing shape stacked along their rows, as one new device array (one copy_rows launch
        each)."""
        total = sum(a.shape[0] for a in arrays)
        out = self.cuda.device_array((total,) + tuple(arrays[0].shape)[1:], np.float32, stream=self.stream)
        start = 0
        for a in arrays:
            elementwise.copy_rows_launch(out, a, start, stream=self.stream)
            start += a.shape[0]
        return out

    def copy_into(self, dst, src):
        """Overwrite device dst with src (same shape), in place."""
        elementwise.copy_rows_launch(dst, src, 0, stream=self.stream)

    def mapped(self, shape, dtype):
        """(host, device): one array in pinned host memory that the device reads in place (mapped memory), as a
        host array to write and a device array to launch with. Writing it is a store into host memory, not a
        driver call that the round would wait for. The host must not write it while queued work may still read it."""
        host = self.cuda.mapped_array(shape, dtype)
        return host, host if SIMULATED else self.cuda.as_cuda_array(host)  # the simulator's is one array already

    def synchronize(self):
        """Wait for the work queued on the backend's stream."""
        self.stream.synchronize()

    def linear(self, x, weight):
        return self.linear_parts(x, weight, [weight.out_features])[0]

    def linear_parts(self, x, weight, widths):
        """NumpyBackend.linear_parts on the device: one GEMM or GEMV that writes each part whole (their `parts`), so
        each is a contiguous array with no copy."""
        return self._gemv(x, weight, parts=widths)

    def swiglu(self, x, weight):
        """NumpyBackend.swiglu on the device: one GEMM or GEMV whose warps hold each gate output beside its up and
        write SiLU(gate) * up (their `gated`)."""
        return self._gemv(x, weight, gated=True)

    def _gemv(self, x, weight, **options):
        """gemm_launch.launch_gemm for an affine Linear, gemv.launch_gemv for a float one, with `parts` or `gated`."""
        if weight.kind == "affine":
            return gemm_launch.launch_gemm(x, weight.out_features, weight.data, weight.scales, weight.biases,
                                           weight.bits, weight.group_size, stream=self.stream, **options)
        kernels = gemv.gemv_f32_kernel if weight.kind == "f32" else gemv.gemv_bf16_kernel
        return gemv.launch_gemv(kernels, x, weight.out_features, weight.data, stream=self.stream, **options)

    def embed(self, ids, weight):
        kernels = {"f32": stored.embed_f32_kernel, "bf16": stored.embed_bf16_kernel,
                   "affine": stored.embed_affine_kernel}
        args = (weight.data,) if weight.kind != "affine" else (weight.data, weight.scales, weight.biases,
                                                                weight.bits, weight.group_size)
        return stored.launch_embed(kernels[weight.kind], self._device(as_int32(ids)), weight.in_features,
                                   *args, stream=self.stream)

    def rmsnorm(self, x, multiplier, eps):
        return norm.rmsnorm_launch(x, multiplier, eps, stream=self.stream)

    def add_rmsnorm(self, h, delta, multiplier, eps):
        return norm.add_rmsnorm_launch(h, delta, multiplier, eps, stream=self.stream)

    def rmsnorm_gated(self, x, z, multiplier, eps):
        return norm.rmsnorm_gated_launch(x, z, multiplier, eps, stream=self.stream)

    def add(self, a, b):
        return elementwise.launch_elementwise(elementwise.add_kernel, a, b, stream=self.stream)

    def silu_mul(self, gate, up):
        return elementwise.launch_elementwise(elementwise.silu_mul_kernel, gate, up, stream=self.stream)

    def causal_conv(self, inputs, tail, weight, taps=None, out=None, in_place=False):
        return conv.causal_conv_launch(inputs, tail, weight, taps, out=out, in_place=in_place, stream=self.stream)

    def causal_conv_lanes(self, inputs, pool, lanes, weight, out):
        return conv.causal_conv_lanes_launch(inputs, pool, lanes, weight, out, stream=self.stream)

    def scan_inputs(self, conv, b, a, a_log, dt_bias, heads, dk, eps, q_scale):
        return deltanet.scan_inputs_launch(conv, b, a, a_log, dt_bias, heads, dk, eps, q_scale, stream=self.stream)

    def deltanet_scan(self, state, q, k, v, decay, beta, depths=None, path_slots=None, out=None, in_place=False):
        return deltanet.deltanet_scan_launch(state, q, k, v, decay, beta, depths, path_slots, in_place, out=out,
                                             stream=self.stream)

    def deltanet_scan_lanes(self, pool, lanes, q, k, v, decay, beta, out):
        return deltanet.deltanet_scan_lanes_launch(pool, lanes, q, k, v, decay, beta, out, stream=self.stream)

    def deltanet_apply(self, state, log, path, in_place=False):
        return deltanet.deltanet_apply_launch(state, log, path, in_place=in_place, stream=self.stream)

    def conv_tail_after(self, tail, inputs, path):
        return conv.conv_tail_after_launch(tail, inputs, path, stream=self.stream)

    def rope(self, x, positions, rotary_dim, theta):
        return rotary.rope_launch(x, self._device(as_int32(positions)), rotary_dim, theta, stream=self.stream)

    def norm_rope(self, q_and_gate, k, q_multiplier, k_multiplier, eps, positions, rotary_dim, theta):
        return rotary.norm_rope_launch(q_and_gate, k, q_multiplier, k_multiplier, eps,
                                       self._device(as_int32(positions)), rotary_dim, theta, stream=self.stream)

    def attention_partial(self, q, keys, values, n_keys, scale, committed=None, path_slots=None, max_keys=None):
        """n_keys on the host or the device; path_slots, like the other index maps, a device array. The partials
        hold chunks for `max_keys` keys: by default the largest of host n_keys, or the whole cache for device
        n_keys (a recorded round, whose key counts change from replay to replay)."""
        if max_keys is None and isinstance(n_keys, (np.ndarray, list)):
            max_keys = int(np.max(n_keys))
        n_keys = self._device(as_int32(n_keys))
        return attention.attention_partial_launch(q, keys, values, n_keys, scale, committed, path_slots,
                                                  stream=self.stream, max_keys=max_keys)

    def attention_merge(self, m, l, o, out=None, q_and_gate=None):
        return attention.attention_merge_launch(m, l, o, out=out, q_and_gate=q_and_gate, stream=self.stream)

    def kv_compact(self, keys, values, committed, path):
        return kv.kv_compact_launch(keys, values, committed, path, stream=self.stream)

    def kv_write(self, keys, values, new_keys, new_values, at):
        return kv.kv_write_launch(keys, values, new_keys, new_values, self._device(at), stream=self.stream)

    def reserve_rows(self, buffer, length, needed, limit=None):
        """NumpyBackend.reserve_rows on a device buffer."""
        if needed <= buffer.shape[0]:
            return buffer
        graphs.refuse("growing a cache buffer")
        grown = self.cuda.device_array((grown_rows(buffer.shape[0], needed, limit),) + tuple(buffer.shape)[1:],
                                       np.float32, stream=self.stream)
        if length:
            grown[:length].copy_to_device(buffer[:length], stream=self.stream)
        return grown

    def append_rows(self, buffer, length, rows, limit=None):
        """Write device `rows` at `buffer[length:]`, growing the device buffer like NumpyBackend.append_rows."""
        graphs.refuse("a copy")
        buffer = self.reserve_rows(buffer, length, length + rows.shape[0], limit)
        buffer[length:length + rows.shape[0]].copy_to_device(rows, stream=self.stream)
        return buffer

    def route(self, logits, k):
        return moe.route_launch(logits, k, stream=self.stream)

    def routed_experts(self, x, ids, experts):
        """The grouped kernels, which read each pair's expert from the device `ids`."""
        self._affine_experts(experts)
        return routed_experts_launch(x, ids, experts.gate_up, experts.down, experts.shared, stream=self.stream)

    def route_experts(self, x, logits, k, experts):
        """The router and the grouping of the pairs in one launch where a round's rows fit a block (moe.py's
        `route_group_launch`), then the grouped kernels."""
        self._affine_experts(experts)
        count = len(experts.down_views)
        ids, weights, grouping = moe.route_group_launch(logits, k, count, experts.shared, stream=self.stream)
        return routed_experts_launch(x, ids, experts.gate_up, experts.down, experts.shared, stream=self.stream,
                                     grouping=grouping), weights

    @staticmethod
    def _affine_experts(experts) -> None:
        """Refuse experts the grouped kernels cannot read: affine only (their twin is exact whatever the grouping;
        the float GEMV's walk has no grouped kernel)."""
        for weight in (experts.gate_up, experts.down):
            if weight.kind != "affine":
                raise BackendError(f"backend 'cuda': routed experts stored as {weight.kind} are not supported; load an "
                                   f"MLX 4- or 8-bit checkpoint, or use backend 'numpy'")

    def moe_combine(self, routed, weights, shared, gate_logit):
        return moe.combine_launch(routed, weights, shared, gate_logit, stream=self.stream)

    sample = staticmethod(sampling.sample)  # one host row of logits (requests with penalties or logprobs)

    def sample_rows(self, logits, seeds, positions, temperature, top_k, top_p, min_p):
        """NumpyBackend.sample_rows on device logits: the draws run on the GPU and only the tokens come back.

        The per-row parameters go in, and the tokens come out, through mapped host memory (`DrawSlots`): stores and
        loads, where six uploads and a download would be seven driver calls a round (and an upload from pageable
        memory waits for the stream). The wait at the end also means no draw still reads the slots when the next
        call rewrites them."""
        rows = logits.shape[0]
        slots = self._draw_slots.get(rows) or self._draw_slots.setdefault(rows, self.draw_slots(rows))
        slots.write(seeds, positions, temperature, top_k, top_p, min_p)
        self.draw_into(logits, slots)
        self.synchronize()
        return slots.tokens()

    def draw_slots(self, rows: int) -> "DrawSlots":
        """Mapped host memory for the draws of `rows` rows: their parameters in, their tokens out."""
        return DrawSlots(self, rows)

    def draw_into(self, logits, slots: "DrawSlots") -> None:
        """Queue the draws of device logits with the parameters in `slots`, their tokens into `slots` (no wait: a
        recorded round's draws are launched inside its recording)."""
        sampling.sample_launch(logits, *slots.device, out=slots.device_tokens, stream=self.stream)

    def topk(self, logits, k):
        """NumpyBackend.topk on device logits: only the k ids and log-probabilities per row come to the host."""
        ids, logprobs = self.topk_on_device(logits, k)
        return self.to_host(ids), self.to_host(logprobs)

    def topk_on_device(self, logits, k):
        """NumpyBackend.topk on device logits, left on the device (a recording's outputs)."""
        return top_k.topk_launch(logits, k, stream=self.stream)


class DrawSlots:
    """`sample_rows`' per-row parameters and tokens for `rows` rows in mapped host memory: `host` to write,
    `device` to launch with (seeds, positions, temperature, top_k, top_p, min_p), and the tokens both ways."""

    DTYPES = (np.uint64, np.uint64, np.float32, np.int32, np.float32, np.float32)

    def __init__(self, backend, rows: int):
        pairs = [backend.mapped(rows, dtype) for dtype in self.DTYPES]
        self.host, self.device = [h for h, _ in pairs], [d for _, d in pairs]
        self.host_tokens, self.device_tokens = backend.mapped(rows, np.int32)

    def write(self, *values) -> None:
        """The per-row parameters (seeds, positions, temperature, top_k, top_p, min_p), stored into the slots."""
        for host, value in zip(self.host, values):
            host[:] = value

    def tokens(self) -> np.ndarray:
        """The tokens, once the draws are done: a copy of the pinned memory (the simulator's mapped array is a
        device array, so there it is copied as one)."""
        return self.host_tokens.copy_to_host() if SIMULATED else np.array(self.host_tokens)


def as_int32(indices):
    """Host indices as an int32 array; a device array as it is."""
    return np.asarray(indices, np.int32) if isinstance(indices, (np.ndarray, list, tuple)) else indices
