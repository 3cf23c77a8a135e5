"""Time the prompt GEMM's three kernels alone at one shape (default: the 2B's gate/up at 2,048 rows)."""
import sys, numpy as np
from numba import cuda
from tensorfold.contract.gemm import random_affine
from tensorfold.cuda import gemm, quantize
rows, outs, cols = (int(a) for a in (sys.argv[1:4] if len(sys.argv) > 3 else (2048, 12288, 2048)))
once = "--once" in sys.argv
rng = np.random.default_rng(0)
packed, scales, biases = (cuda.to_device(a) for a in random_affine(rng, outs, cols, 4, 64))
x = cuda.to_device(rng.normal(size=(rows, cols)).astype(np.float32))
words, rows_pad = gemm.quantize_shape(rows, 4, 64, cols)
def q(): return quantize.launch_quantize(x, 4, 64, words, rows_pad)
qd = q()
def p(): return gemm.launch_products(qd, rows, outs, packed, scales, biases, 4, 64)
def timed(f, n=10):
    f(); cuda.synchronize()
    if once: return 0.0
    a, b = cuda.event(), cuda.event(); a.record()
    for _ in range(n): f()
    b.record(); b.synchronize(); return cuda.event_elapsed_time(a, b) / n * 1e3
tq, tp = timed(q), timed(p)
print(f"{rows}x{outs}x{cols}: quantize {tq:.1f} us, products+combine {tp:.1f} us, {2*rows*outs*cols/tp/1e6:.1f} TOPS")
