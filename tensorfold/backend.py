"""Backends: where the model's operations run. The model calls ops through a backend and never imports numba.

* `numpy` runs the twins of `tensorfold/cuda/` on any machine.
* `cuda` runs the kernels beside them on the GPU: weights uploaded once, every array a numba device array, every
  launch on one stream. Under numba's CUDA simulator (`NUMBA_ENABLE_CUDASIM=1`) the same backend runs the kernels
  on the CPU, which is how the test suite checks them without a GPU.
* `auto` picks `cuda` when a real GPU is usable, else `numpy`.

Both offer the same methods with the same arguments; the arrays a backend returns are its own.
"""
import dataclasses
import os

import numpy as np

from .cuda import attention, conv, deltanet, elementwise, gemv, sampling
from .cuda import rmsnorm as norm
from .cuda import rope as rotary
from .cuda import topk as top_k
from .errors import BackendError

BACKENDS = ("numpy", "cuda", "auto")


def grown_rows(current: int, needed: int, limit: int | None) -> int:
    """The new row capacity of a full cache buffer: double it (fewer copies), but stay within `limit`."""
    rows = max(needed, 2 * current)
    return max(needed, min(rows, limit)) if limit else rows


class NumpyBackend:
    """The NumPy twins, one method per kernel family."""

    name = "numpy"

    def linear(self, x, weight):
        """x [rows, in] @ weight.T for a `Linear` in any of its forms."""
        if weight.kind == "f32":
            return gemv.gemv_f32(x, weight.data)
        if weight.kind == "bf16":
            return gemv.gemv_bf16(x, weight.data)
        return gemv.gemv_affine(x, weight.data, weight.scales, weight.biases, weight.bits, weight.group_size)

    def embed(self, ids, weight):
        return weight.rows(ids)

    rmsnorm = staticmethod(norm.rmsnorm)
    rmsnorm_gated = staticmethod(norm.rmsnorm_gated)
    l2norm = staticmethod(norm.l2norm)
    causal_conv = staticmethod(conv.causal_conv)
    deltanet_gates = staticmethod(deltanet.deltanet_gates)
    deltanet_scan = staticmethod(deltanet.deltanet_scan)
    deltanet_apply = staticmethod(deltanet.deltanet_apply)
    rope = staticmethod(rotary.rope)
    attention_partial = staticmethod(attention.attention_partial)
    attention_merge = staticmethod(attention.attention_merge)
    kv_compact = staticmethod(attention.kv_compact)
    add = staticmethod(elementwise.add)
    silu_mul = staticmethod(elementwise.silu_mul)
    sigmoid_mul = staticmethod(elementwise.sigmoid_mul)
    take_last = staticmethod(elementwise.take_last)
    sample = staticmethod(sampling.sample)
    sample_rows = staticmethod(sampling.sample_rows)

    def zeros(self, shape):
        return np.zeros(shape, np.float32)

    def upload(self, array):
        """A host array (or Linear) as this backend's (NumPy: the thing itself)."""
        return array

    def append_rows(self, buffer, length, rows, limit=None):
        """Write `rows` at `buffer[length:]`, growing the buffer when full (doubling, but never past `limit` rows
        when given); returns the buffer."""
        needed = length + len(rows)
        if needed > len(buffer):
            grown = np.zeros((grown_rows(len(buffer), needed, limit),) + buffer.shape[1:], buffer.dtype)
            grown[:length] = buffer[:length]
            buffer = grown
        buffer[length:needed] = rows
        return buffer

    def concat_rows(self, arrays):
        """Arrays of equal trailing shape stacked along their rows, as one new array."""
        return np.concatenate(arrays)

    def to_host(self, array) -> np.ndarray:
        return np.asarray(array)

    def topk(self, logits, k):
        """The k best ids of each row of logits [rows, V] and their log-softmax values: host arrays int32 and
        float32 [rows, k], best first (ties: the lower id first)."""
        return top_k.topk(logits, k)


class CudaBackend:
    """The kernels, launched on one stream over numba device arrays."""

    name = "cuda"

    def __init__(self):
        from numba import cuda
        if not cuda.is_available():
            raise BackendError("backend 'cuda': no usable CUDA GPU here (numba.cuda.is_available() is False); "
                               "use backend 'numpy'")
        self.cuda = cuda
        self.pooled = False  # whether device memory comes from tensorfold.device_pool (a real GPU, a fresh context)
        if not simulated() and os.environ.get("TENSORFOLD_DEVICE_POOL", "1") != "0":
            from . import device_pool
            self.pooled = device_pool.install()
        self.stream = cuda.stream()

    def _device(self, array):
        return self.cuda.to_device(np.ascontiguousarray(array), stream=self.stream)

    def upload(self, weight):
        """Weights go to the device once: a Linear's arrays, or a plain array."""
        if isinstance(weight, np.ndarray):
            return self._device(weight)
        parts = {f: self._device(getattr(weight, f)) for f in ("data", "scales", "biases")
                 if getattr(weight, f) is not None}
        return dataclasses.replace(weight, **parts)

    def zeros(self, shape):
        return self._device(np.zeros(shape, np.float32))

    def to_host(self, array) -> np.ndarray:
        return array.copy_to_host(stream=self.stream)

    def concat_rows(self, arrays):
        """Arrays of equal trailing shape stacked along their rows, as one new device array."""
        total = sum(a.shape[0] for a in arrays)
        out = self.cuda.device_array((total,) + tuple(arrays[0].shape)[1:], np.float32, stream=self.stream)
        start = 0
        for a in arrays:
            if a.shape[0]:
                out[start:start + a.shape[0]].copy_to_device(a, stream=self.stream)
            start += a.shape[0]
        return out

    def linear(self, x, weight):
        s = self.stream
        if weight.kind == "f32":
            return gemv.launch_gemv(gemv.gemv_f32_kernel, x, weight.out_features, weight.data, stream=s)
        if weight.kind == "bf16":
            return gemv.launch_gemv(gemv.gemv_bf16_kernel, x, weight.out_features, weight.data, stream=s)
        return gemv.launch_gemv(gemv.gemv_affine_kernel, x, weight.out_features, weight.data, weight.scales,
                                weight.biases, weight.bits, weight.group_size, stream=s)

    def embed(self, ids, weight):
        kernels = {"f32": gemv.embed_f32_kernel, "bf16": gemv.embed_bf16_kernel, "affine": gemv.embed_affine_kernel}
        args = (weight.data,) if weight.kind != "affine" else (weight.data, weight.scales, weight.biases,
                                                                weight.bits, weight.group_size)
        return gemv.launch_embed(kernels[weight.kind], self._device(np.asarray(ids, np.int32)), weight.in_features,
                                 *args, stream=self.stream)

    def rmsnorm(self, x, multiplier, eps):
        return norm.rmsnorm_launch(x, multiplier, eps, stream=self.stream)

    def rmsnorm_gated(self, x, z, multiplier, eps):
        return norm.rmsnorm_gated_launch(x, z, multiplier, eps, stream=self.stream)

    def l2norm(self, x, eps, scale=1.0):
        return norm.l2norm_launch(x, eps, scale, stream=self.stream)

    def add(self, a, b):
        return elementwise.launch_elementwise(elementwise.add_kernel, a, b, stream=self.stream)

    def silu_mul(self, gate, up):
        return elementwise.launch_elementwise(elementwise.silu_mul_kernel, gate, up, stream=self.stream)

    def sigmoid_mul(self, x, gate):
        return elementwise.launch_elementwise(elementwise.sigmoid_mul_kernel, x, gate, stream=self.stream)

    def take_last(self, x, start, stop):
        return elementwise.take_last_launch(x, start, stop, stream=self.stream)

    def causal_conv(self, inputs, tail, weight, taps=None):
        return conv.causal_conv_launch(inputs, tail, weight, taps, stream=self.stream)

    def deltanet_gates(self, b, a, a_log, dt_bias):
        return deltanet.deltanet_gates_launch(b, a, a_log, dt_bias, stream=self.stream)

    def deltanet_scan(self, state, q, k, v, decay, beta, depths=None, path_slots=None):
        return deltanet.deltanet_scan_launch(state, q, k, v, decay, beta, depths, path_slots, stream=self.stream)

    def deltanet_apply(self, state, log, path):
        return deltanet.deltanet_apply_launch(state, log, path, stream=self.stream)

    def rope(self, x, positions, rotary_dim, theta):
        return rotary.rope_launch(x, self._device(np.asarray(positions, np.int32)), rotary_dim, theta,
                                stream=self.stream)

    def attention_partial(self, q, keys, values, n_keys, scale, committed=None, path_slots=None):
        """n_keys on the host (its largest sets the chunks); path_slots, like the other index maps, a device array
        (uploaded once a round by the model)."""
        return attention.attention_partial_launch(q, keys, values, self._device(np.asarray(n_keys, np.int32)),
                                                  scale, committed, path_slots, stream=self.stream,
                                                  max_keys=int(np.max(n_keys)))

    def attention_merge(self, m, l, o):
        return attention.attention_merge_launch(m, l, o, stream=self.stream)

    def kv_compact(self, keys, values, committed, path):
        return attention.kv_compact_launch(keys, values, committed, path, stream=self.stream)

    def append_rows(self, buffer, length, rows, limit=None):
        """Write device `rows` at `buffer[length:]`, growing the device buffer like NumpyBackend.append_rows."""
        needed = length + rows.shape[0]
        if needed > buffer.shape[0]:
            grown = self.cuda.device_array((grown_rows(buffer.shape[0], needed, limit),) + tuple(buffer.shape)[1:],
                                           np.float32, stream=self.stream)
            if length:
                grown[:length].copy_to_device(buffer[:length], stream=self.stream)
            buffer = grown
        buffer[length:needed].copy_to_device(rows, stream=self.stream)
        return buffer

    sample = staticmethod(sampling.sample)  # one host row of logits (requests with penalties or logprobs)

    def sample_rows(self, logits, seeds, positions, temperature, top_k, top_p, min_p):
        """NumpyBackend.sample_rows on device logits: the draws run on the GPU and only the tokens come back."""
        params = (self._device(a) for a in (seeds, positions, temperature, top_k, top_p, min_p))
        return self.to_host(sampling.sample_launch(logits, *params, stream=self.stream))

    def topk(self, logits, k):
        """NumpyBackend.topk on device logits: only the k ids and log-probabilities per row come to the host."""
        ids, logprobs = top_k.topk_launch(logits, k, stream=self.stream)
        return self.to_host(ids), self.to_host(logprobs)


def simulated() -> bool:
    """Whether numba's CUDA simulator stands in for the GPU in this process."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def make_backend(name: str):
    """The backend called `name`: "numpy", "cuda" or "auto" (the GPU when one is usable, else NumPy)."""
    if name not in BACKENDS:
        raise BackendError(f"unknown backend {name!r}: choose one of {', '.join(BACKENDS)}")
    if name == "auto":
        from numba import cuda
        return CudaBackend() if cuda.is_available() and not simulated() else NumpyBackend()
    return CudaBackend() if name == "cuda" else NumpyBackend()
