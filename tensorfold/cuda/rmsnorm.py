"""RMSNorm in its uses: `y = x / sqrt(mean(x^2) + eps) * weight`, the same after the residual add (`add_rmsnorm`:
h + delta and its norm in one launch), the gated norm that multiplies by SiLU(z), and the L2 norm of DeltaNet's
queries and keys (`x / sqrt(sum(x^2) + eps) * scale`, no mean), which only deltanet.scan_inputs applies on the
device, with this file's block tree (`thread_squares`, `block_inverse_rms`), as it takes q, k and v out of the conv
output.

Mapping (the kernels): one block of THREADS threads per vector (a row, or one head of a row). Thread t sums the
squares of elements t, t + THREADS, ... with fma32; the block adds the partial sums in a fixed tree; then every
thread scales its own elements. The twins vectorise over vectors and threads and keep that order. A thread loads
LOADS of its elements before it uses any (`load_batch`), so their latencies overlap: a loop that adds each value as
it arrives waits for 16 loads in turn on a row of 2,048. In the plain and residual norms a vector of at most
THREADS * LOADS elements is one such batch a thread, loaded once with everything else it needs and kept in
registers until it is scaled; only a longer one is read a second time (the gated norm keeps one path: see its
kernel).

Centred versus plain weights: Qwen3.5 stores most norm weights centred at zero (`1 + w` multiplies) and the gated
norm's plainly; the loader turns both into the multiplier itself, so twins and kernels only ever multiply.
"""
import numpy as np
from numba import cuda

from tensorfold.cuda.fmath import block_dot, fma32, silu32, silu32_twin, sqrt32
from tensorfold.device.launch import kernel

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


def add_rmsnorm(h, delta, multiplier, eps):
    """The residual add and the norm after it, in one pass: (h + delta, rmsnorm(h + delta))."""
    total = np.add(h, delta, dtype=np.float32)
    return total, rmsnorm(total, multiplier, eps)


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
def load_window(x, n, start, width, first, batch):
    """batch[u] = x[n, start + first + u * THREADS] for u < LOADS, all in flight together: element first + u *
    THREADS of the vector that is row n's columns start .. start + width - 1 (past its end: its last element,
    which the callers skip)."""
    for u in range(LOADS):
        batch[u] = x[n, start + min(first + u * THREADS, width - 1)]


@cuda.jit(device=True)
def load_batch(x, n, first, batch):
    """load_window over the whole of row n. A multiplier [width] comes as one vector, [1, width]."""
    load_window(x, n, 0, x.shape[1], first, batch)


@cuda.jit(device=True)
def thread_squares(x, n, start, length, t):
    """The thread's sum of squares over its elements of the vector x[n, start:start + length], in order, LOADS
    loads in flight at a time."""
    batch = cuda.local.array(LOADS, np.float32)
    acc = np.float32(0)
    for first in range(t, length, THREADS * LOADS):
        load_window(x, n, start, length, first, batch)
        for u in range(LOADS):  # the thread's elements in order: k = first + u * THREADS
            if first + u * THREADS < length:
                acc = fma32(batch[u], batch[u], acc)
    return acc


@cuda.jit(device=True)
def batch_squares(batch, t, width):
    """thread_squares of a vector that is one batch a thread (its elements t, t + THREADS, ... held in `batch`)."""
    acc = np.float32(0)
    for u in range(LOADS):
        if t + u * THREADS < width:
            acc = fma32(batch[u], batch[u], acc)
    return acc


@cuda.jit(device=True)
def block_inverse_rms(acc, t, length, eps, mean):
    """inverse_rms of a vector of `length`, from each thread's sum of squares `acc`: the block's tree, then the
    root (every thread gets the result). The one function of the file with a shared array: a kernel that reached it
    by two paths would link the array twice, which NVVM refuses."""
    partial = cuda.shared.array(THREADS, np.float32)
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
        squares = squares / np.float32(length)
    return np.float32(1.0) / sqrt32(squares + np.float32(eps))  # == np.sqrt in float32


@cuda.jit(device=True)
def block_scale(x, multiplier, n, t, inv, y):
    """y = x * inv * multiplier over the thread's elements of vector n."""
    batch, factors = cuda.local.array(LOADS, np.float32), cuda.local.array(LOADS, np.float32)
    for first in range(t, x.shape[1], THREADS * LOADS):
        load_batch(x, n, first, batch)
        load_batch(multiplier, 0, first, factors)
        for u in range(LOADS):
            if first + u * THREADS < x.shape[1]:
                y[n, first + u * THREADS] = batch[u] * inv * factors[u]


@kernel
def rmsnorm_kernel(x, multiplier, eps, y):
    """A row of at most THREADS * LOADS elements stays in registers from the sum of squares to the scaling (see
    add_rmsnorm_kernel); a longer one is read twice."""
    n, t = cuda.blockIdx.x, cuda.threadIdx.x
    width = x.shape[1]
    if width <= THREADS * LOADS:  # the same for the whole block: its barriers are reached by every thread
        batch, factors = cuda.local.array(LOADS, np.float32), cuda.local.array(LOADS, np.float32)
        load_batch(x, n, t, batch)
        load_batch(multiplier, 0, t, factors)
        inv = block_inverse_rms(batch_squares(batch, t, width), t, width, eps, True)
        for u in range(LOADS):
            if t + u * THREADS < width:
                y[n, t + u * THREADS] = batch[u] * inv * factors[u]
    else:
        inv = block_inverse_rms(thread_squares(x, n, 0, width, t), t, width, eps, True)
        block_scale(x, multiplier, n, t, inv, y)


@kernel
def add_rmsnorm_kernel(h, delta, multiplier, eps, total, y):
    """total = h + delta, then rmsnorm_kernel's work on total.

    A row of at most THREADS * LOADS elements (every Qwen3.5 up to 2B) is one batch a thread: the sums stay in
    registers from the add to the scaling, and the multiplier's loads are in flight with h's and delta's, so the
    kernel waits on memory once, not three times (writing total and reading it back twice). A longer row goes pass
    by pass through total; each thread reads back only the elements it wrote (the same t, t + THREADS, ... in every
    pass), so no barrier is needed between the add and the norm."""
    n, t = cuda.blockIdx.x, cuda.threadIdx.x
    width = h.shape[1]
    batch, more = cuda.local.array(LOADS, np.float32), cuda.local.array(LOADS, np.float32)
    if width <= THREADS * LOADS:  # the same for the whole block: its barriers are reached by every thread
        factors = cuda.local.array(LOADS, np.float32)
        load_batch(h, n, t, batch)
        load_batch(delta, n, t, more)
        load_batch(multiplier, 0, t, factors)
        for u in range(LOADS):
            if t + u * THREADS < width:
                batch[u] = batch[u] + more[u]
                total[n, t + u * THREADS] = batch[u]
        inv = block_inverse_rms(batch_squares(batch, t, width), t, width, eps, True)
        for u in range(LOADS):
            if t + u * THREADS < width:
                y[n, t + u * THREADS] = batch[u] * inv * factors[u]
    else:
        for first in range(t, width, THREADS * LOADS):
            load_batch(h, n, first, batch)
            load_batch(delta, n, first, more)
            for u in range(LOADS):
                if first + u * THREADS < width:
                    total[n, first + u * THREADS] = batch[u] + more[u]
        inv = block_inverse_rms(thread_squares(total, n, 0, width, t), t, width, eps, True)
        block_scale(total, multiplier, n, t, inv, y)


@kernel
def rmsnorm_gated_kernel(x, z, multiplier, eps, y):
    """One path only, with no batch held from the sum of squares to the scaling as the other norms have: its
    SiLU is many instructions, unrolled LOADS times, and a second copy of them makes the kernel slower in a decode
    round, though faster alone."""
    n, t = cuda.blockIdx.x, cuda.threadIdx.x
    width = x.shape[1]
    inv = block_inverse_rms(thread_squares(x, n, 0, width, t), t, width, eps, True)
    batch, factors, gates = (cuda.local.array(LOADS, np.float32), cuda.local.array(LOADS, np.float32),
                             cuda.local.array(LOADS, np.float32))
    for first in range(t, width, THREADS * LOADS):
        load_batch(x, n, first, batch)
        load_batch(multiplier, 0, first, factors)
        load_batch(z, n, first, gates)
        for u in range(LOADS):
            if first + u * THREADS < width:
                y[n, first + u * THREADS] = batch[u] * inv * factors[u] * silu32(gates[u])


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


def add_rmsnorm_launch(h, delta, multiplier, eps, stream=0):
    """(h + delta, its rmsnorm) for device h, delta [..., width]: two new arrays, one launch."""
    total = cuda.device_array(h.shape, np.float32, stream=stream)
    y = launch_norm(add_rmsnorm_kernel, h, as_vectors(delta), as_vectors(multiplier), eps, as_vectors(total),
                    stream=stream)
    return total, y


def rmsnorm_gated_launch(x, z, multiplier, eps, stream=0):
    return launch_norm(rmsnorm_gated_kernel, x, as_vectors(z), as_vectors(multiplier), eps, stream=stream)
