"""RMSNorm in its three uses: `y = x / sqrt(mean(x^2) + eps) * weight`, the gated norm that multiplies by SiLU(z),
and the L2 norm of DeltaNet's queries and keys (`x / sqrt(sum(x^2) + eps) * scale`, no mean).

Mapping (the kernels): one block of THREADS threads per vector (a row, or one head of a row). Thread t sums the
squares of elements t, t + THREADS, ... with fma32; the block adds the partial sums in a fixed tree; then every
thread scales its own elements. The twins vectorise over vectors and threads and keep that order. A thread loads
LOADS of its elements before it uses any (`load_batch`), so their latencies overlap: a loop that adds each value
as it arrives waits for 16 loads in turn on a row of 2,048, and a one-row norm took about 10 us.

Centred versus plain weights: Qwen3.5 stores most norm weights centred at zero (`1 + w` multiplies) and the gated
norm's plainly; the loader turns both into the multiplier itself, so twins and kernels only ever multiply.
"""
import numpy as np
from numba import cuda

from ..contract import KernelCheck
from .common import swap_rows, to_host
from .fmath import block_dot, fma32, silu32, silu32_twin, sqrt32
from .launch import kernel

THREADS = 128
LOADS = 16  # elements a thread loads before it uses any


def inverse_rms(x, eps, mean=True):
    """1 / sqrt(sum(x^2) / n + eps) over the last axis (without `/ n` when `mean` is false), float32."""
    squares = block_dot(x, x, THREADS)
    if mean:
        squares = squares / np.float32(x.shape[-1])
    return np.float32(1.0) / np.sqrt(squares + np.float32(eps))


def rmsnorm(x, multiplier, eps):
    """x [..., width] normalised over its last axis and multiplied by `multiplier` [width]."""
    x = np.asarray(x, np.float32)
    return x * inverse_rms(x, eps)[..., None] * multiplier


def rmsnorm_gated(x, z, multiplier, eps):
    """The DeltaNet output norm: rmsnorm(x) * SiLU(z), over the last axis (one head's values)."""
    return rmsnorm(x, multiplier, eps) * silu32_twin(z)


def l2norm(x, eps, scale=1.0):
    """x / sqrt(sum(x^2) + eps) over the last axis, times `scale` (DeltaNet's 1 / sqrt(dk) for queries)."""
    x = np.asarray(x, np.float32)
    return x * inverse_rms(x, eps, mean=False)[..., None] * np.float32(scale)


# --- the kernels --------------------------------------------------------------------------------------------------
# Block n normalises vector n of x viewed as [vectors, width]; thread t owns elements t, t + THREADS, ...

@cuda.jit(device=True)
def load_batch(x, n, first, batch):
    """batch[u] = x[n, first + u * THREADS] for u < LOADS, all in flight together (past the end: the last element,
    which the callers skip). A multiplier [width] comes as one vector, [1, width]."""
    for u in range(LOADS):
        batch[u] = x[n, min(first + u * THREADS, x.shape[1] - 1)]


@cuda.jit(device=True)
def block_inverse_rms(x, n, t, eps, mean):
    """inverse_rms of vector n, computed by the whole block (every thread gets the result)."""
    partial = cuda.shared.array(THREADS, np.float32)
    batch = cuda.local.array(LOADS, np.float32)
    acc = np.float32(0)
    for first in range(t, x.shape[1], THREADS * LOADS):
        load_batch(x, n, first, batch)
        for u in range(LOADS):  # the thread's elements in order: k = first + u * THREADS
            if first + u * THREADS < x.shape[1]:
                acc = fma32(batch[u], batch[u], acc)
    partial[t] = acc
    width = THREADS // 2
    while width > 0:
        cuda.syncthreads()
        if t < width:
            partial[t] += partial[t + width]
        width //= 2
    cuda.syncthreads()
    squares = partial[0]
    cuda.syncthreads()  # everyone has read partial[0] before a next use of the buffer
    if mean:
        squares = squares / np.float32(x.shape[1])
    return np.float32(1.0) / sqrt32(squares + np.float32(eps))  # == np.sqrt in float32


@kernel
def rmsnorm_kernel(x, multiplier, eps, y):
    n, t = cuda.blockIdx.x, cuda.threadIdx.x
    inv = block_inverse_rms(x, n, t, eps, True)
    batch, factors = cuda.local.array(LOADS, np.float32), cuda.local.array(LOADS, np.float32)
    for first in range(t, x.shape[1], THREADS * LOADS):
        load_batch(x, n, first, batch)
        load_batch(multiplier, 0, first, factors)
        for u in range(LOADS):
            if first + u * THREADS < x.shape[1]:
                y[n, first + u * THREADS] = batch[u] * inv * factors[u]


@kernel
def rmsnorm_gated_kernel(x, z, multiplier, eps, y):
    n, t = cuda.blockIdx.x, cuda.threadIdx.x
    inv = block_inverse_rms(x, n, t, eps, True)
    batch, factors, gates = (cuda.local.array(LOADS, np.float32), cuda.local.array(LOADS, np.float32),
                             cuda.local.array(LOADS, np.float32))
    for first in range(t, x.shape[1], THREADS * LOADS):
        load_batch(x, n, first, batch)
        load_batch(multiplier, 0, first, factors)
        load_batch(z, n, first, gates)
        for u in range(LOADS):
            if first + u * THREADS < x.shape[1]:
                y[n, first + u * THREADS] = batch[u] * inv * factors[u] * silu32(gates[u])


@kernel
def l2norm_kernel(x, eps, scale, y):
    n, t = cuda.blockIdx.x, cuda.threadIdx.x
    inv = block_inverse_rms(x, n, t, eps, False)
    batch = cuda.local.array(LOADS, np.float32)
    for first in range(t, x.shape[1], THREADS * LOADS):
        load_batch(x, n, first, batch)
        for u in range(LOADS):
            if first + u * THREADS < x.shape[1]:
                y[n, first + u * THREADS] = batch[u] * inv * np.float32(scale)


def as_vectors(a):
    """A contiguous device array [..., width] viewed as [vectors, width]."""
    width = a.shape[len(a.shape) - 1]
    return a.reshape(a.size // width, width)


def launch_norm(kernel, x, *args, stream=0):
    """Launch a norm kernel over x [..., width] (one block per vector); args follow x in the kernel's order."""
    y = cuda.device_array((x.size // x.shape[len(x.shape) - 1], x.shape[len(x.shape) - 1]), np.float32,
                          stream=stream)
    kernel[y.shape[0], THREADS, stream](as_vectors(x), *args, y)
    return y.reshape(x.shape)


def rmsnorm_launch(x, multiplier, eps, stream=0):
    return launch_norm(rmsnorm_kernel, x, as_vectors(multiplier), eps, stream=stream)


def rmsnorm_gated_launch(x, z, multiplier, eps, stream=0):
    return launch_norm(rmsnorm_gated_kernel, x, as_vectors(z), as_vectors(multiplier), eps, stream=stream)


def l2norm_launch(x, eps, scale=1.0, stream=0):
    return launch_norm(l2norm_kernel, x, eps, scale, stream=stream)


# --- the contract -------------------------------------------------------------------------------------------------

def _cases(mode, rng):
    """(rows, vectors per row, width): whole rows of D, and the per-head norms (q/k norms, DeltaNet heads)."""
    shapes = [(3, 1, 40), (2, 3, 130)] if mode == "sim" else [(1, 1, 1024), (16, 1, 2048), (128, 1, 1024),
                                                               (16, 8, 256), (5, 16, 128), (3, 1, 1000)]
    cases = []
    for rows, vectors, width in shapes:
        x = rng.normal(size=(rows, vectors, width)).astype(np.float32)
        z = rng.normal(size=(rows, vectors, width)).astype(np.float32)
        cases.append((f"{rows}x{vectors}x{width}", {"x": x, "z": z, "multiplier": (1 + rng.normal(size=width) * 0.3)
                                                    .astype(np.float32), "eps": 1e-6}))
    return cases


_CONTROLS = {"two swapped rows": swap_rows("x"), "eps off by a factor of ten": lambda i: {**i, "eps": i["eps"] * 10}}
CONTRACT = [
    KernelCheck("rmsnorm", lambda x, z, multiplier, eps: rmsnorm(x, multiplier, eps),
                lambda x, z, multiplier, eps: to_host(rmsnorm_launch(cuda.to_device(x), cuda.to_device(multiplier), eps)),
                _cases, _CONTROLS),
    KernelCheck("rmsnorm_gated", rmsnorm_gated,
                lambda x, z, multiplier, eps: to_host(rmsnorm_gated_launch(
                    cuda.to_device(x), cuda.to_device(z), cuda.to_device(multiplier), eps)),
                _cases, {**_CONTROLS, "gate of another row": swap_rows("z")}),
    KernelCheck("l2norm", lambda x, z, multiplier, eps: l2norm(x, eps, 0.125),
                lambda x, z, multiplier, eps: to_host(l2norm_launch(cuda.to_device(x), eps, 0.125)),
                _cases, _CONTROLS),
]
