"""
GEMV over a round's rows, and the norms: one reduction order for every row
===========================================================================

Most of a decode step is GEMV: every weight matrix is read once and multiplied with the few rows of the round.
This tutorial reads the twin and the kernel of ``tensorfold/cuda/gemv.py`` side by side, runs the kernel under
numba's CUDA simulator, and shows why its result does not depend on how many rows run together.

You will learn about:

* the mapping: each output's THREADS threads walking chunks of CHUNK columns with a stride, one accumulator per
  row, then a fixed halving tree; a warp computes two outputs and a block a tile of rows, so loads are reused;
* how 4-bit MLX weights take another road: exact integer sums of codes times x in fixed point
  (``tensorfold/cuda/gemm.py``), whose order cannot matter, so the tensor cores may add them;
* ``fma32`` and ``fma_rn``: why a multiply-add is written out explicitly so that NumPy and the GPU round it the
  same way, and how the GEMV's single rounding is reproduced in NumPy;
* the same pattern in RMSNorm (``tensorfold/cuda/rmsnorm.py``), and the elementwise kernels between them.

Run it with ``python tutorials/02_gemv.py`` (no GPU needed: it uses the simulator unless one is present).
"""

# %%
# The simulator must be chosen before numba.cuda is first imported. `show` prints a twin (left) beside its kernel
# (right), the lines that do the same work on the same row (tutorials/_side_by_side.py).
import inspect
import os
import sys
from fractions import Fraction

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

from _side_by_side import show  # noqa: E402
from tensorfold.cuda import gemm, gemm_launch, gemv, quantize, rmsnorm  # noqa: E402
from tensorfold.cuda.fmath import block_dot, fma32, tree_sum  # noqa: E402
from tensorfold.numerics.floats import add_rounded_once, fma_rn_twin  # noqa: E402
from tensorfold.numerics.formats import affine_rows, quantize_affine  # noqa: E402


def check(ok, message):
    if not ok:
        sys.exit(f"CHECK FAILED: {message}")
    print(f"ok: {message}")


# %%
# The exact multiply-add
# ----------------------
# The GPU compiler fuses ``acc + w * x`` into one FMA (one rounding); NumPy rounds twice. So every multiply-add is
# written out. The short sums (the norms, the conv) use ``fma32``: it computes in float64, where the product of two
# float32 values is exact, and rounds to float32, the same bits everywhere.
print(inspect.getsource(fma32.py_func))
w, x, acc = np.float32(1.1), np.float32(3.3), np.float32(-3.63)
print(f"two roundings: {w * x + acc!r}, through float64: {fma32.py_func(w, x, acc)!r}")
# The GEMV makes far more multiply-adds than anything else (every weight, for every row), and the float64
# conversions would cap it: it uses ``fma_rn``, the GPU's own fma.rn.f32, whose single rounding the twin reproduces
# by rounding the float64 sum to odd wherever it sits exactly halfway between two float32 values. (So do the
# DeltaNet scan and attention, whose sums are long chains of dependent multiply-adds.)
print(inspect.getsource(add_rounded_once.py_func))
halfway, tiny = np.float32(1 + 2 ** -12), np.float32(2 ** -80)  # halfway * halfway = 1 + 2^-11 + 2^-24: a tie
exact = Fraction(float(halfway)) ** 2 + Fraction(float(tiny))  # just above the tie: rounds up
up = np.float32(1 + 2 ** -11 + 2 ** -23)
check(fma_rn_twin(halfway, halfway, tiny) == up and fma32.py_func(halfway, halfway, tiny) != up and
      Fraction(float(up)) - exact < exact - Fraction(float(np.float32(1 + 2 ** -11))),
      "fma_rn rounds the exact value once; fma32's float64 sum lands on the tie and rounds it down")

# %%
# The twin and the kernel
# -----------------------
# Thread t of an output's warp walks the chunks t, t + THREADS, ... (CHUNK columns each, in order). In the twin, one
# pass of the loop over `e` is one step of every thread's walk, vectorised over (thread, row, output); `walk_order`
# lays the columns out so that a step's are neighbours, and `tree_sum` is the warp's halving tree. The kernel
# (`gemv_kernel` builds one per weight format and tile of rows) runs the same walk for the two outputs of its warp
# and the rows of its block's tile: it holds a chunk as stored (the format's `hold`, from `*_format`), then for each
# pair of columns loads the tile's x values, and for each column dequantizes the weight (`weight`) and makes the
# multiply-adds, each output's in the walk's order. Read them side by side: a round of the twin beside a chunk of
# the kernel, a step e beside a column e, and the twin's `tree_sum` beside the kernel's tree (`tree_writer`).
show([gemv.walk_order, gemv.gemv, tree_sum], [gemv.gemv_kernel, gemv.tree_writer],
     align=[("for first in range(0, out_features", "if base < count"),
            ("for start in range", "for c in range(t, chunks"),
            ("for e in range(CHUNK)", "for e in range(CHUNK)"),
            ("tree_sum(np.moveaxis", "partial = cuda.shared"),
            ("def tree_sum", "def tree_writer"),
            ("while width > 1", "while width > 0")])
print(f"the walk's first step over 64 columns: thread t takes column {gemv.walk_order(64)[:8].tolist()}[t]")
# The tile kernel reads x in *pair walk order*: a thread's columns e and e + 1 side by side, and the threads' pairs
# side by side, so that one 8-byte load brings a thread two columns and the 32 threads of a warp read 256
# neighbouring bytes (the columns t * CHUNK + e they need are CHUNK floats apart). `walk_x` is that layout, and a
# small kernel makes it, [tile, round, row, position] for tiles of rows (the kernel takes tiles of one row: row by
# row). Here tiles of 4:
walked = gemv.walk_x(np.arange(2 * 64, dtype=np.float32).reshape(2, 64), 4)
print(f"x in pair walk order, first positions: {walked[0, 0, 0, :8].tolist()} (columns; padded to a whole round)")
check(walked.shape == (1, 1, 4, gemv.THREADS * gemv.CHUNK) and walked[0, 0, 1, 1] == 64 + 1
      and walked[0, 0, 1, 2] == 64 + gemv.CHUNK and not walked[0, 0, 2:].any(),
      "positions 0 and 1 hold thread 0's first pair of columns, position 2 thread 1's first column (column CHUNK); "
      "the tile's rows past the last hold zero")

# %%
# Run the kernel (simulated) and compare bits
# -------------------------------------------
rng = np.random.default_rng(0)
rows, outputs, columns = 3, 4, 200  # 25 chunks: threads 25 to 31 of each warp have nothing to add
x = rng.normal(size=(rows, columns)).astype(np.float32)
weight = rng.normal(size=(outputs, columns)).astype(np.float32)
twin = gemv.gemv_f32(x, weight)
kernel = gemv.launch_gemv(gemv.gemv_f32_kernel, cuda.to_device(x), outputs, cuda.to_device(weight)).copy_to_host()
check(twin.tobytes() == kernel.tobytes(), "GEMV kernel == twin, bit for bit")
check(np.allclose(twin, x.astype(np.float64) @ weight.T, rtol=1e-5, atol=1e-4), "and close to float64 math")

# %%
# Rows do not change each other
# -----------------------------
# Each output's order of additions depends only on the number of columns, THREADS and CHUNK. A prompt of many rows
# and the same rows one by one give the same bits, which is what lets a prompt pass equal one-row steps.
alone = np.concatenate([gemv.gemv_f32(x[r:r + 1], weight) for r in range(rows)])
check(alone.tobytes() == twin.tobytes(), "rows computed together == rows computed alone")
blas = (x @ weight.T).astype(np.float32)
print(f"(a BLAS matmul differs from the fixed tree in {np.count_nonzero(blas != twin)} of {twin.size} outputs)")

# %%
# 4-bit weights: exact integer sums instead of the walk
# -----------------------------------------------------
# MLX stores 8 codes per uint32 word (element 0 in the lowest nibble) and one bf16 scale and bias per group of 64
# columns: w = scale * code + bias, and the codes are integers already. `tensorfold/cuda/quantize.py` makes x
# integer too, per row and group (`fixed_point`: X = floor(x * 2^(P - e) + 0.5), e the group's exponent, in three
# signed bytes), so every sum of code times X is an exact integer, whatever order adds it: the kernel takes them
# from the tensor cores (`mma_s8u8`, tensorfold/cuda/ptx.py), the twin from a BLAS matrix product. Only the
# combination of the groups, in float64 products that are exact, follows one fixed order. The twin (left) and the
# kernels (right; a round of a few rows takes `gemm.round_kernel`, the same products with the combine in the block,
# and a prompt chunk `gemm.whole_kernel`, each warp walking all of K and adding the chunks itself in the same order):
show([quantize.quantize_x, gemm.gemm_affine], [quantize.quantize_kernel, gemm.gemm_kernel])
columns = 128
x = rng.normal(size=(rows, columns)).astype(np.float32)
packed, scale_bits, bias_bits = quantize_affine(rng.normal(size=(outputs, columns)).astype(np.float32), 4, 64)
scales, biases = gemv.bf16_to_f32(scale_bits), gemv.bf16_to_f32(bias_bits)
print(f"packed weights {packed.shape} {packed.dtype}, scales {scales.shape}")
twin = gemm.gemm_affine(x, packed, scales, biases, 4, 64)
on_device = [cuda.to_device(a) for a in (packed, scales, biases)]
kernel = gemm_launch.launch_gemm(cuda.to_device(x), outputs, *on_device, 4, 64).copy_to_host()
check(twin.tobytes() == kernel.tobytes(), "4-bit GEMM kernel == twin, bit for bit")
one_row = gemm_launch.launch_gemm(cuda.to_device(x[:1]), outputs, *on_device, 4, 64).copy_to_host()
check(one_row.tobytes() == twin[:1].tobytes(), "one row alone == the twin's first row, bit for bit")
dense = affine_rows(packed, scales, biases, 4, 64, np.arange(outputs)).astype(np.float64)
print(f"largest difference from the float64 product of the dequantized weights: "
      f"{np.abs(twin - x.astype(np.float64) @ dense.T).max():.2e} (x's fixed point, then float32)")

# The MLP's gate and up projections are stacked in one weight (gate rows, then up rows). A gated GEMM computes every
# sum as above, each warp holding gate outputs beside their up outputs, and writes SiLU(gate) * up where it writes:
# the MLP's hidden values take no launch of their own (`gemv.swiglu` is the twin).
gated = gemm_launch.launch_gemm(cuda.to_device(x), outputs, *on_device, 4, 64, gated=True).copy_to_host()
check(gated.shape == (rows, outputs // 2) and gated.tobytes() == gemv.swiglu(twin).tobytes(),
      "the gated GEMM == SiLU(gate) * up of the twin's outputs, bit for bit")

# %%
# The same pattern in RMSNorm
# ---------------------------
# One block per vector; strided sums of squares with fma32, the same halving tree, then each thread scales its
# own elements by the multiplier (1 + w for Qwen3.5's centred norms, folded in at load time). The twin's
# `block_dot` is each thread's strided sum and the tree, as the kernel's `thread_squares` and `block_inverse_rms`:
show([block_dot, rmsnorm.inverse_rms, rmsnorm.rmsnorm],
     [rmsnorm.thread_squares, rmsnorm.block_inverse_rms, rmsnorm.rmsnorm_kernel],
     align=[("for start in range", "for first in range"),
            ("return tree_sum", "return acc"),
            ("def inverse_rms", "def block_inverse_rms"),
            ("def rmsnorm", "def rmsnorm_kernel")])
x = rng.normal(size=(2, 3, 40)).astype(np.float32)
multiplier = (1 + 0.3 * rng.normal(size=40)).astype(np.float32)
twin = rmsnorm.rmsnorm(x, multiplier, 1e-6)
kernel = rmsnorm.rmsnorm_launch(cuda.to_device(x), cuda.to_device(multiplier), 1e-6).copy_to_host()
check(twin.tobytes() == kernel.tobytes(), "RMSNorm kernel == twin, bit for bit")

# %%
# The elementwise steps between them
# ----------------------------------
# The residual add and SiLU(gate) * up (the MLP's, where gate and up are not stacked) are one thread per element
# (`tensorfold/cuda/elementwise.py`): nothing to reduce, so nothing to order. Their
# transcendentals come from `fmath`, where each device function has a NumPy twin that evaluates the same float64
# expression (numba compiles `math` functions inside kernels, not NumPy ufuncs).
from tensorfold.cuda import elementwise  # noqa: E402
from tensorfold.cuda.fmath import silu32, silu32_twin  # noqa: E402

show([silu32_twin, elementwise.silu_mul], [silu32, elementwise.silu_mul_kernel],
     align=[("def silu_mul", "def silu_mul_kernel")])
gate, up = rng.normal(size=(3, 50)).astype(np.float32) * 8, rng.normal(size=(3, 50)).astype(np.float32)
twin = elementwise.silu_mul(gate, up)
kernel = elementwise.launch_elementwise(elementwise.silu_mul_kernel, cuda.to_device(gate),
                                        cuda.to_device(up)).copy_to_host()
check(twin.tobytes() == kernel.tobytes(), "SiLU(gate) * up kernel == twin, bit for bit")
