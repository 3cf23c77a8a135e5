"""The exact-integer GEMM (tensorfold/cuda/gemm.py): the twin against a brute-force integer reference and against
the float64 product of the dequantized weights; the kernels against the twin bit for bit (tiny shapes under the
simulator)."""
import numpy as np
import pytest
from numba import cuda

from tensorfold.cuda import gemm, gemm_launch
from tensorfold.cuda.fmath import exact_float64, power_of_two
from tensorfold.cuda.gemm import CHUNK_COLUMNS, gemm_affine
from tensorfold.cuda.gemm_launch import kernel_shape, launch_gemm
from tensorfold.cuda.gemv import swiglu
from tensorfold.cuda.quantize import LIMBS, P, digit_position, launch_quantize, quantize_x
from tensorfold.numerics.formats import bf16_to_f32, quantize_affine


def weight(rng, outs, columns, bits, group_size):
    packed, scales, biases = quantize_affine(rng.normal(size=(outs, columns)).astype(np.float32), bits, group_size)
    return packed, bf16_to_f32(scales), bf16_to_f32(biases)


def x_rows(rng, rows, columns):
    """Rows of mixed magnitude, one group of zeros and one tiny value beside a large one."""
    x = (rng.normal(size=(rows, columns)) * np.exp(rng.normal(size=(rows, 1)) * 3)).astype(np.float32)
    x[0, :32] = 0
    if columns > 64:
        x[-1, 64], x[-1, 65] = 1e-30, 3e5
    return x


def reference(x, packed, scales, biases, bits, group_size):
    """Brute force: Python integers for X, D and S, then the groups in float64, a partial sum a chunk of columns."""
    rows, columns = x.shape
    per_word = 32 // bits
    codes = np.array([[(int(packed[o, k // per_word]) >> (bits * (k % per_word))) & ((1 << bits) - 1)
                       for k in range(columns)] for o in range(len(packed))], np.int64)
    y = np.zeros((rows, len(packed)), np.float32)
    for r in range(rows):
        acc, partial = np.zeros(len(packed)), np.zeros(len(packed))
        for g in range(columns // group_size):
            part = x[r, g * group_size:(g + 1) * group_size].astype(np.float64)
            e = int(np.frexp(np.abs(part).max())[1])
            X = np.floor(part * 2.0 ** (P - e) + 0.5).astype(np.int64)
            assert np.abs(X).max() <= 2 ** P
            D = codes[:, g * group_size:(g + 1) * group_size] @ X
            t = scales[:, g].astype(np.float64) * D + biases[:, g].astype(np.float64) * float(X.sum())
            partial = partial + t * 2.0 ** (e - P)
            if (g + 1) * group_size % CHUNK_COLUMNS == 0 or (g + 1) * group_size == columns:
                acc, partial = acc + partial, np.zeros(len(packed))
        y[r] = acc
    return y


@pytest.mark.parametrize("bits,group_size", [(4, 32), (4, 64), (8, 32), (8, 64)])
def test_twin_equals_the_brute_force(bits, group_size):
    rng = np.random.default_rng(bits + group_size)
    x, w = x_rows(rng, 5, 1216), weight(rng, 7, 1216, bits, group_size)  # two whole chunks of K and a short one
    y = gemm_affine(x, *w, bits, group_size)
    assert np.array_equal(y, reference(x, *w, bits, group_size))
    dropped = x.copy()
    dropped[:, 600:600 + group_size] = 0
    assert not np.array_equal(y, reference(dropped, *w, bits, group_size)), "control: columns of x zeroed"


def test_digits_rebuild_X():
    rng = np.random.default_rng(3)
    x = x_rows(rng, 4, 128)
    X, _, S = quantize_x(x, 64)
    assert np.abs(X).max() <= 2 ** P and np.array_equal(S, X.reshape(4, 2, 64).sum(axis=2))
    digits = launch_quantize(cuda.to_device(x), 4, 64, 4, 8)[0].copy_to_host().astype(np.int64)
    position = digit_position.py_func(np.arange(128), 4, 4)
    assert sorted(position) == list(range(128)), "a permutation of the columns"
    rebuilt = digits[0] + 256 * digits[1] + 65536 * digits[2]
    assert np.array_equal(rebuilt[:4, position], X) and not rebuilt[4:].any()
    assert digits.min() >= -128 and digits.max() <= 127 and LIMBS == 3


def test_quantize_covers_every_block():
    """Rows and groups enough for several blocks of the quantize kernel: every (row, group) thread is launched."""
    rng = np.random.default_rng(5)
    x = x_rows(rng, 3, 768)
    X, e, S = quantize_x(x, 64)
    digits, exponents, sums = (a.copy_to_host() for a in launch_quantize(cuda.to_device(x), 4, 64, 1, 8))
    digits = digits.astype(np.int64)
    rebuilt = (digits[0] + 256 * digits[1] + 65536 * digits[2])[:, digit_position.py_func(np.arange(768), 4, 1)]
    assert np.array_equal(rebuilt[:3], X) and np.array_equal(exponents[:3], e) and np.array_equal(sums[:3], S)
    assert not rebuilt[3:].any() and not sums[3:].any()


def test_twin_is_close_to_the_exact_product():
    """The rounding of x to P bits a group: far below float32's accumulated error."""
    rng = np.random.default_rng(4)
    x, w = rng.normal(size=(3, 512)).astype(np.float32), weight(rng, 64, 512, 4, 64)
    dense = np.repeat(w[1], 64, axis=1).astype(np.float64) * gemm_codes(w[0]) + np.repeat(w[2], 64, axis=1)
    exact = x.astype(np.float64) @ dense.T
    error = np.abs(gemm_affine(x, *w, 4, 64) - exact).max() / np.abs(exact).max()
    assert error < 1e-6, error


def gemm_codes(packed):
    return ((packed[:, :, None] >> np.arange(0, 32, 4, dtype=np.uint32)) & 15).reshape(len(packed), -1)


def launched(x, w, bits, group_size, **options):
    args = [cuda.to_device(a) for a in (x, *w)]
    y = launch_gemm(args[0], len(w[0]), *args[1:], bits, group_size, **options)
    return [p.copy_to_host() for p in y] if isinstance(y, list) else y.copy_to_host()


SHAPES = [(1, 4, 32), (3, 4, 64), (16, 8, 32), (17, 4, 32), (24, 4, 64), (40, 8, 64), (1, 8, 32), (9, 8, 64)]


@pytest.mark.parametrize("rows,bits,group_size", SHAPES)
def test_kernel_equals_twin(rows, bits, group_size):
    rng = np.random.default_rng(rows * bits + group_size)
    columns, outs = (128, 11) if rows <= 16 else (64, 9)
    x, w = x_rows(rng, rows, columns), weight(rng, outs, columns, bits, group_size)
    expected = gemm_affine(x, *w, bits, group_size)
    assert np.array_equal(launched(x, w, bits, group_size), expected)
    swapped = x.copy()
    swapped[[0, -1]] = swapped[[-1, 0]]
    if rows > 1:  # control: two rows swapped
        assert not np.array_equal(launched(swapped, w, bits, group_size), expected)


def test_a_wide_weights_round_kernel(monkeypatch):
    """The round kernel's four tiles a warp (a weight at least WIDE_OUTPUTS wide, here made small), whole, in parts
    and gated, against the twin; control: two rows swapped."""
    monkeypatch.setattr(gemm_launch, "WIDE_OUTPUTS", 16)
    rng = np.random.default_rng(12)
    x, w = x_rows(rng, 3, 128), weight(rng, 40, 128, 4, 64)
    assert kernel_shape(3, 4, 64, 128, 40)[2] == gemm.WIDE_TILES
    expected = gemm_affine(x, *w, 4, 64)
    assert np.array_equal(launched(x, w, 4, 64), expected)
    assert np.array_equal(np.concatenate(launched(x, w, 4, 64, parts=(7, 20, 13)), axis=1), expected)
    assert np.array_equal(launched(x, w, 4, 64, gated=True), swiglu(expected))
    assert not np.array_equal(launched(x[[2, 1, 0]], w, 4, 64), expected)


def test_kernel_in_parts_and_gated():
    rng = np.random.default_rng(9)
    x, w = x_rows(rng, 3, 128), weight(rng, 20, 128, 4, 64)
    parts = launched(x, w, 4, 64, parts=(5, 8, 7))
    assert [p.shape for p in parts] == [(3, 5), (3, 8), (3, 7)]
    assert np.array_equal(np.concatenate(parts, axis=1), gemm_affine(x, *w, 4, 64))
    w = weight(rng, 160, 128, 4, 64)  # more gates than one block of the round kernel takes outputs
    assert np.array_equal(launched(x, w, 4, 64, gated=True), swiglu(gemm_affine(x, *w, 4, 64)))
    x = x_rows(rng, 18, 64)
    w = weight(rng, 18, 64, 4, 32)
    assert np.array_equal(launched(x, w, 4, 32, gated=True), swiglu(gemm_affine(x, *w, 4, 32)))


def test_a_prompt_kernel_over_two_chunks_of_k():
    """A prompt's rows over two chunks of K (the second short), whole, in parts and gated; control: the rows with
    their second chunk zeroed (what a kernel that stopped after one chunk would multiply) differ."""
    rng = np.random.default_rng(11)
    x, w = x_rows(rng, 20, CHUNK_COLUMNS + 64), weight(rng, 18, CHUNK_COLUMNS + 64, 4, 64)
    expected = gemm_affine(x, *w, 4, 64)
    assert np.array_equal(launched(x, w, 4, 64), expected)
    assert np.array_equal(np.concatenate(launched(x, w, 4, 64, parts=(5, 6, 7)), axis=1), expected)
    assert np.array_equal(launched(x, w, 4, 64, gated=True), swiglu(expected))
    first_chunk = x.copy()
    first_chunk[:, CHUNK_COLUMNS:] = 0
    assert not np.array_equal(gemm_affine(first_chunk, *w, 4, 64), expected)


def test_a_rounds_chunks_in_its_block_and_apart(monkeypatch):
    """A round over three chunks of K (the last short), whole, in parts and gated: the round kernel (a warp a chunk),
    and past ROUND_CHUNKS (made 2) the GEMM kernel and the combine; control: the rows with their last chunk zeroed
    (what a block that left out its last warp's chunk would multiply) differ."""
    rng = np.random.default_rng(13)
    columns = 2 * CHUNK_COLUMNS + 64
    x, w = x_rows(rng, 3, columns), weight(rng, 18, columns, 4, 64)
    expected = gemm_affine(x, *w, 4, 64)
    for round_chunks in (3, 2):
        monkeypatch.setattr(gemm_launch, "ROUND_CHUNKS", round_chunks)
        assert np.array_equal(launched(x, w, 4, 64), expected)
        assert np.array_equal(np.concatenate(launched(x, w, 4, 64, parts=(5, 6, 7)), axis=1), expected)
        assert np.array_equal(launched(x, w, 4, 64, gated=True), swiglu(expected))
    last_chunk = x.copy()
    last_chunk[:, 2 * CHUNK_COLUMNS:] = 0
    assert not np.array_equal(gemm_affine(last_chunk, *w, 4, 64), expected)


def test_the_contract_sees_an_output_left_unwritten(monkeypatch):
    """The contract's GEMM launch starts y as NaNs: a round kernel that writes nothing fails the check, whatever a
    fresh array would have held (a freed one's values: the twin's own, in the simulator)."""
    from tensorfold.contract import outputs_equal
    from tensorfold.contract.gemm import _launch, _twin

    class WritesNothing:
        def __getitem__(self, launch_config):
            return lambda *args: None

    rng = np.random.default_rng(15)
    inputs = dict(x=x_rows(rng, 3, 128), **dict(zip(("packed", "scales", "biases"), weight(rng, 11, 128, 4, 64))),
                  bits=4, group_size=64)
    assert outputs_equal(_twin(**inputs), _launch(**inputs))
    monkeypatch.setattr(gemm_launch, "round_kernel", lambda *shape: WritesNothing())
    assert not outputs_equal(_twin(**inputs), _launch(**inputs))


def test_kernel_shapes():
    assert kernel_shape(1, 4, 64, 2048) == (4, 1, 2) and kernel_shape(16, 8, 64, 2048) == (4, 2, 2)
    # a wide weight's round of up to 8 rows: four tiles a warp; of 16 rows, two
    assert kernel_shape(8, 4, 64, 2048, 12288) == (4, 1, 4) and kernel_shape(16, 4, 64, 2048, 12288) == (4, 2, 2)
    assert kernel_shape(3, 4, 32, 96) == (1, 1, 2)
    # a prompt's step: one group of 64 columns (8-byte loads of 4-bit codes, 16-byte of 8-bit), or a narrower group's
    assert kernel_shape(512, 4, 64, 2048) == (2, 4, 4) and kernel_shape(512, 8, 64, 2048) == (4, 4, 4)
    assert kernel_shape(512, 4, 32, 2048) == (1, 4, 4) and kernel_shape(512, 8, 32, 2048) == (2, 4, 4)


@cuda.jit
def bits_kernel(integers, exponents, converted, powers):
    i = cuda.grid(1)
    if i < integers.shape[0]:
        converted[i] = exact_float64(integers[i])
        powers[i] = power_of_two(exponents[i])


def test_float64_from_bits():
    """The combination's conversions (fmath.exact_float64, power_of_two) equal float64(n) and ldexp(1, k) over the
    ranges the GEMM gives them: D below 2^37, S below 2^29, 2^(e - P) for every float32 exponent."""
    rng = np.random.default_rng(5)
    integers = np.concatenate([rng.integers(-2**37, 2**37, 300), [0, 1, -1, 2**37, -2**37]]).astype(np.int64)
    exponents = np.resize(np.arange(-149 - P, 129 - P, dtype=np.int32), len(integers))
    converted, powers = cuda.device_array(len(integers)), cuda.device_array(len(integers))
    bits_kernel[1, len(integers)](cuda.to_device(integers), cuda.to_device(exponents), converted, powers)
    assert np.array_equal(converted.copy_to_host(), integers.astype(np.float64))
    assert np.array_equal(powers.copy_to_host(), np.ldexp(1.0, exponents))
    assert not np.array_equal(powers.copy_to_host(), np.ldexp(1.0, exponents + 1)), "control: a power off by one"
