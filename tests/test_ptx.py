"""The PTX intrinsics (tensorfold/cuda/ptx.py) against NumPy: the tensor-core tile, fragment layout included, and
the 16- and 8-byte loads. Under the simulator these check the Python forms the kernels run in CI; under --gpu the
hardware."""
import numpy as np
import pytest
from numba import cuda

from tensorfold.cuda.ptx import load8, load16, mma_s8u8, prefetch_l2


@cuda.jit
def tile_kernel(a, b, c, order, d):
    lane = cuda.threadIdx.x
    out = mma_s8u8(a[lane, order[0]], a[lane, order[1]], a[lane, order[2]], a[lane, order[3]], b[lane, 0],
                   b[lane, 1], c[lane, 0], c[lane, 1], c[lane, 2], c[lane, 3])
    for i in range(4):
        d[lane, i] = out[i]


def load_kernel(load, count):
    """A kernel that writes load(words, starts[i]) to out[i] (count words) for every start."""
    @cuda.jit
    def run(words, starts, out):
        i = cuda.grid(1)
        if i < starts.shape[0]:
            got = load(words, np.uint64(starts[i]))
            for w in range(count):
                out[i, w] = got[w]
    return run


def word(values):
    """Four 8-bit values as one uint32, the first in the lowest byte."""
    b = np.asarray(values).astype(np.int64) & 255
    return np.uint32(b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24)


def fragments(a, b, c):
    """The lanes' registers for A [16, 32], B [32, 8] and C [16, 8] in the layout of the PTX ISA."""
    fa, fb, fc = np.zeros((32, 4), np.uint32), np.zeros((32, 2), np.uint32), np.zeros((32, 4), np.int32)
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        for i in range(4):
            k = 4 * t + 16 * (i >> 1)
            fa[lane, i] = word(a[g + 8 * (i & 1), k:k + 4])
            fc[lane, i] = c[g + 8 * (i >> 1), 2 * t + (i & 1)]
        for j in range(2):
            fb[lane, j] = word(b[4 * t + 16 * j:4 * t + 16 * j + 4, g])
    return fa, fb, fc


def tile(d):
    """The [16, 8] result from the lanes' accumulators."""
    out = np.zeros((16, 8), np.int64)
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        for i in range(4):
            out[g + 8 * (i >> 1), 2 * t + (i & 1)] = d[lane, i]
    return out


def run_tile(a, b, c, order=(0, 1, 2, 3)):
    fa, fb, fc = fragments(a, b, c)
    d = cuda.to_device(np.zeros((32, 4), np.int32))
    tile_kernel[1, 32](cuda.to_device(fa), cuda.to_device(fb), cuda.to_device(fc),
                       cuda.to_device(np.array(order, np.int32)), d)
    return tile(d.copy_to_host())


def test_mma_equals_the_integer_product():
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (16, 32))
    b = rng.integers(0, 256, (32, 8))
    c = rng.integers(-2**20, 2**20, (16, 8))
    assert np.array_equal(run_tile(a, b, c), a @ b + c)


def test_mma_extremes():
    """Every byte at its extreme: -128 against 255 (the sign of A and the unsigned B both matter)."""
    a = np.full((16, 32), -128)
    a[::2] = 127
    b = np.full((32, 8), 255)
    b[:, 1] = 0
    c = np.zeros((16, 8), np.int64)
    assert np.array_equal(run_tile(a, b, c), a @ b)


def test_control_a_mislaid_register_fails():
    """Planted: A registers 1 and 2 passed in each other's place."""
    rng = np.random.default_rng(1)
    a, b = rng.integers(-128, 128, (16, 32)), rng.integers(0, 256, (32, 8))
    c = np.zeros((16, 8), np.int64)
    assert not np.array_equal(run_tile(a, b, c, order=(0, 2, 1, 3)), a @ b)


@pytest.mark.parametrize("load,count", [(load16, 4), (load8, 2)])
def test_vector_load_equals_the_words(load, count):
    rng = np.random.default_rng(count)
    words = rng.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)
    starts = np.array([0, count, 32, 64 - count], np.int64)
    out = cuda.to_device(np.zeros((4, count), np.uint32))
    load_kernel(load, count)[1, 32](cuda.to_device(words), cuda.to_device(starts), out)
    assert np.array_equal(out.copy_to_host(), np.stack([words[s:s + count] for s in starts]))
    assert not np.array_equal(out.copy_to_host()[1], words[count + 1:2 * count + 1]), "control: the next words differ"


@cuda.jit
def prefetch_then_load_kernel(words, starts, out):
    i = cuda.grid(1)
    if i < starts.shape[0]:
        prefetch_l2(words, np.uint64(starts[i]))
        out[i] = words[starts[i]]


def test_prefetch_changes_no_value(on_gpu):
    """A line asked of L2 and then loaded gives the words as they are (on the GPU the prefetch is real); in the
    simulator, whose prefetch does nothing else, an index past the array fails, as the GPU's would ask for a line of
    other memory. Controls: the next words differ, so a load from the wrong place would show; the last word's index
    (63) passes."""
    words = np.arange(7, 71, dtype=np.uint32) * np.uint32(2654435761)
    starts = np.array([0, 5, 32, 63], np.int64)
    out = cuda.to_device(np.zeros(4, np.uint32))
    prefetch_then_load_kernel[1, 32](cuda.to_device(words), cuda.to_device(starts), out)
    assert np.array_equal(out.copy_to_host(), words[starts])
    assert not np.array_equal(out.copy_to_host()[:3], words[starts[:3] + 1]), "control: the next words differ"
    if not on_gpu:
        with pytest.raises(AssertionError):
            prefetch_then_load_kernel[1, 32](cuda.to_device(words), cuda.to_device(np.array([64])),
                                             cuda.to_device(np.zeros(1, np.uint32)))


@pytest.mark.parametrize("load,count", [(load16, 4), (load8, 2)])
def test_simulator_refuses_a_misaligned_vector_load(load, count, on_gpu):
    """A vector load whose address is not a multiple of its bytes faults on the GPU; the simulator's form refuses it
    too, so a kernel that would fault there fails in CI: a start one word past a multiple, and a start of 0 in a view
    that begins one word into its array. Controls: a start at the multiple, and a view that begins `count` words in,
    load their words."""
    if on_gpu:
        pytest.skip("on the GPU a misaligned load faults the context; this checks the simulator's form")
    words = np.arange(64, dtype=np.uint32)
    out = cuda.to_device(np.zeros((1, count), np.uint32))
    for source, start in ((cuda.to_device(words), count), (cuda.to_device(words)[count:], 0)):
        load_kernel(load, count)[1, 32](source, cuda.to_device(np.array([start])), out)
        assert np.array_equal(out.copy_to_host()[0], words[count:2 * count])
    for source, start in ((cuda.to_device(words), count + 1), (cuda.to_device(words)[1:], 0)):
        with pytest.raises(AssertionError):
            load_kernel(load, count)[1, 32](source, cuda.to_device(np.array([start])), out)
