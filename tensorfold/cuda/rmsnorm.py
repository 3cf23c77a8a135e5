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
registers until it is scaled; only a longer one is read a second time (the gated norm keeps one path: see
`rmsnorm_gated_vector`).

A norm whose output an exact GEMM reads next has a second form (`*_digits_kernel`): the same norm, then its block
quantizes the row it wrote for that GEMM (quantize.py), so the GEMM needs no quantize launch of its own.

Centred versus plain weights: Qwen3.5 stores most norm weights centred at zero (`1 + w` multiplies) and the gated
norm's plainly; the loader turns both into the multiplier itself, so twins and kernels only ever multiply.
"""
import functools

import numpy as np
from numba import cuda

from tensorfold.cuda.fmath import block_dot, fma32, silu32, silu32_twin, sqrt32
from tensorfold.cuda.quantize import LIMBS, QUANTIZE_COLUMNS, quantize_columns
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


@cuda.jit(device=True)
def rmsnorm_vector(x, multiplier, eps, y, n, t):
    """A row of at most THREADS * LOADS elements stays in registers from the sum of squares to the scaling (see
    add_rmsnorm_vector); a longer one is read twice."""
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


@cuda.jit(device=True)
def held_write(batch, factors, inv, total, y, n, t):
    """Row n of a sum held one batch a thread (batch[u]: element t + u * THREADS, factors[u] its multiplier) written to
    total, and times inv (`block_inverse_rms` of it) to y: the end of `add_rmsnorm_vector`'s short path, which moe.py's
    combine takes too. (Its caller calls block_inverse_rms: a kernel that reached it by two paths would not link.)"""
    for u in range(LOADS):
        if t + u * THREADS < y.shape[1]:
            total[n, t + u * THREADS] = batch[u]
            y[n, t + u * THREADS] = batch[u] * inv * factors[u]


@cuda.jit(device=True)
def add_rmsnorm_vector(h, delta, multiplier, eps, total, y, n, t):
    """total = h + delta, then rmsnorm_vector's work on total.

    A row of at most THREADS * LOADS elements (every Qwen3.5 up to 2B) is one batch a thread: the sums stay in
    registers from the add to the scaling, and the multiplier's loads are in flight with h's and delta's, so the
    kernel waits on memory once, not three times (writing total and reading it back twice). A longer row goes pass
    by pass through total; each thread reads back only the elements it wrote (the same t, t + THREADS, ... in every
    pass), so no barrier is needed between the add and the norm."""
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
        inv = block_inverse_rms(batch_squares(batch, t, width), t, width, eps, True)
        held_write(batch, factors, inv, total, y, n, t)
    else:
        for first in range(t, width, THREADS * LOADS):
            load_batch(h, n, first, batch)
            load_batch(delta, n, first, more)
            for u in range(LOADS):
                if first + u * THREADS < width:
                    total[n, first + u * THREADS] = batch[u] + more[u]
        inv = block_inverse_rms(thread_squares(total, n, 0, width, t), t, width, eps, True)
        block_scale(total, multiplier, n, t, inv, y)


@cuda.jit(device=True)
def rmsnorm_gated_vector(x, z, multiplier, eps, y, n, t):
    """One path only, with no batch held from the sum of squares to the scaling as the other norms have: its
    SiLU is many instructions, unrolled LOADS times, and a second copy of them makes the kernel slower in a decode
    round, though faster alone."""
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


@kernel
def rmsnorm_kernel(x, multiplier, eps, y):
    rmsnorm_vector(x, multiplier, eps, y, cuda.blockIdx.x, cuda.threadIdx.x)


@kernel
def add_rmsnorm_kernel(h, delta, multiplier, eps, total, y):
    add_rmsnorm_vector(h, delta, multiplier, eps, total, y, cuda.blockIdx.x, cuda.threadIdx.x)


@kernel
def rmsnorm_gated_kernel(x, z, multiplier, eps, y):
    rmsnorm_gated_vector(x, z, multiplier, eps, y, cuda.blockIdx.x, cuda.threadIdx.x)


# --- the norms that also quantize their output for the GEMM that reads it next ------------------------------------
# Block n normalises vector n as above, then its threads quantize the vector (quantize.py's `quantize_columns`, the
# quantize kernel's own arithmetic) from the y it just wrote: the GEMM's quantize launch is gone, and its digits are
# the same bits. The grid covers the GEMM's padded rows; a padding row's blocks write zero digits.

@functools.cache
def quantize_vector(bits, words, group_size):
    """A device function: vector x[n] (zeros where not `live`) quantized by the block, QUANTIZE_COLUMNS columns a
    thread, as columns offset .. of `row` of the digits. Every thread of the block calls it together, each warp
    running its loop as often as the others (a group's lanes meet by shuffles)."""
    columns = quantize_columns(bits, words, group_size)

    @cuda.jit(device=True)
    def vector(x, n, live, digits, exponents, sums, row, offset):
        width = x.shape[1]
        for start in range(0, width, THREADS * QUANTIZE_COLUMNS):
            first = start + cuda.threadIdx.x * QUANTIZE_COLUMNS
            columns(x, n, live, first, first < width, digits, exponents, sums, row, offset)

    return vector


@functools.cache
def quantize_steps(steps, group_size):
    """A device function: `quantize_vector` in each layout of `steps`, (bits, words) pairs, one or two, into
    digits[i], exponents[i] and sums[i] for layout i."""
    first, last = (quantize_vector(bits, words, group_size) for bits, words in (steps[0], steps[-1]))
    two = len(steps) == 2
    assert len(steps) <= 2, "one layout or two"

    @cuda.jit(device=True)
    def each(x, n, live, digits, exponents, sums, row, offset):
        first(x, n, live, digits[0], exponents[0], sums[0], row, offset)
        if two:
            last(x, n, live, digits[1], exponents[1], sums[1], row, offset)

    return each


@functools.cache
def rmsnorm_digits_kernel(steps, group_size):
    """rmsnorm_kernel, then row n's digits in each layout (`quantize_steps`); block n of the padded rows."""
    quantize = quantize_steps(steps, group_size)

    @kernel
    def rmsnorm_digits(x, multiplier, eps, y, digits, exponents, sums):
        n, t = cuda.blockIdx.x, cuda.threadIdx.x
        live = n < x.shape[0]  # the same for the whole block
        if live:
            rmsnorm_vector(x, multiplier, eps, y, n, t)
        cuda.syncthreads()  # the block's stores of y are seen by all its threads
        quantize(y, n, live, digits, exponents, sums, n, 0)

    return rmsnorm_digits


@functools.cache
def add_rmsnorm_digits_kernel(steps, group_size):
    """add_rmsnorm_kernel, then row n's digits in each layout (`quantize_steps`); block n of the padded rows."""
    quantize = quantize_steps(steps, group_size)

    @kernel
    def add_rmsnorm_digits(h, delta, multiplier, eps, total, y, digits, exponents, sums):
        n, t = cuda.blockIdx.x, cuda.threadIdx.x
        live = n < h.shape[0]
        if live:
            add_rmsnorm_vector(h, delta, multiplier, eps, total, y, n, t)
        cuda.syncthreads()
        quantize(y, n, live, digits, exponents, sums, n, 0)

    return add_rmsnorm_digits


@functools.cache
def rmsnorm_gated_digits_kernel(steps, group_size):
    """rmsnorm_gated_kernel, then head vector n's digits in each layout (`quantize_steps`) as its columns of its row:
    block n of the padded rows' heads, a head's groups within it."""
    quantize = quantize_steps(steps, group_size)

    @kernel
    def rmsnorm_gated_digits(x, z, multiplier, eps, y, digits, exponents, sums):
        n, t = cuda.blockIdx.x, cuda.threadIdx.x
        heads = digits.shape[3] // x.shape[1]
        live = n < x.shape[0]
        if live:
            rmsnorm_gated_vector(x, z, multiplier, eps, y, n, t)
        cuda.syncthreads()
        quantize(y, n, live, digits, exponents, sums, n // heads, n % heads * x.shape[1])

    return rmsnorm_gated_digits


def as_vectors(a):
    """A contiguous device array [..., width] viewed as [vectors, width]."""
    width = a.shape[len(a.shape) - 1]
    return a.reshape(a.size // width, width)


def launch_norm(kernel, x, *args, stream=0, layout=None, shape=None):
    """Launch a norm over x [..., width] (one block per vector); args follow x in the kernel's order. Returns y in
    `shape` (x's by default). With `layout`, (steps, group_size, rows_pad) of the GEMMs that read y next
    (gemm_launch.py's `reader_layout`: their rows y's, K y's last axis as `shape` has it), `kernel` is the factory of
    the norm that also writes y's digits in each layout, which then ride on y (quantize.py's `quantized_for`)."""
    width = x.shape[len(x.shape) - 1]
    y = cuda.device_array((x.size // width, width), np.float32, stream=stream)
    shape = x.shape if shape is None else shape
    if layout is None:
        kernel[y.shape[0], THREADS, stream](as_vectors(x), *args, y)
        return y.reshape(shape)
    steps, group_size, rows_pad = layout
    columns = shape[len(shape) - 1]
    digits = cuda.device_array((len(steps), LIMBS, rows_pad, columns), np.int8, stream=stream)
    exponents = cuda.device_array((len(steps), rows_pad, columns // group_size), np.int32, stream=stream)
    sums = cuda.device_array((len(steps), rows_pad, columns // group_size), np.int32, stream=stream)
    kernel(steps, group_size)[rows_pad * (columns // width), THREADS, stream](as_vectors(x), *args, y, digits,
                                                                             exponents, sums)
    y = y.reshape(shape)
    y.gemm_digits = {(bits, group_size, words): (digits[i], exponents[i], sums[i])
                     for i, (bits, words) in enumerate(steps)}
    return y


def rmsnorm_launch(x, multiplier, eps, stream=0, layout=None):
    """rmsnorm of device x [..., width]; `layout`: launch_norm's."""
    return launch_norm(rmsnorm_kernel if layout is None else rmsnorm_digits_kernel, x, as_vectors(multiplier), eps,
                       stream=stream, layout=layout)


def add_rmsnorm_launch(h, delta, multiplier, eps, stream=0, layout=None):
    """(h + delta, its rmsnorm) for device h, delta [..., width]: two new arrays, one launch; `layout`:
    launch_norm's."""
    total = cuda.device_array(h.shape, np.float32, stream=stream)
    y = launch_norm(add_rmsnorm_kernel if layout is None else add_rmsnorm_digits_kernel, h, as_vectors(delta),
                    as_vectors(multiplier), eps, as_vectors(total), stream=stream, layout=layout)
    return total, y


def rmsnorm_gated_launch(x, z, multiplier, eps, stream=0, layout=None):
    """rmsnorm_gated of device x, z [rows, heads, width]: y [rows, heads * width], each row's heads side by side (the
    output projection's input); `layout`: launch_norm's, whose groups must not cross a head."""
    rows, heads, width = x.shape
    assert layout is None or width % layout[1] == 0, "a head holds whole groups"
    return launch_norm(rmsnorm_gated_kernel if layout is None else rmsnorm_gated_digits_kernel, x, as_vectors(z),
                       as_vectors(multiplier), eps, stream=stream, layout=layout, shape=(rows, heads * width))
