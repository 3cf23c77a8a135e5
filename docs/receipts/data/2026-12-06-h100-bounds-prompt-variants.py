import sys, os
sys.path.insert(0, "tools"); sys.path.insert(0, ".")
import sass_counts as sc
sc.without_a_device()
from numba import types
from tensorfold.cuda import gemm
u32, i32, f32, f64 = (getattr(types, n)[::1] for n in ("uint32", "int32", "float32", "float64"))
products = (u32, i32, i32, types.int64, types.int64, u32, types.int64, f32, f32, types.int64, f64, types.int64, types.int64)
words = gemm.kernel_shape(512, 4, 64, 2048, 2048)[0]
for rh, tiles in [(4, 4), (2, 4), (4, 2), (3, 4), (4, 3), (2, 8), (3, 3), (2, 6)]:
    k = gemm.gemm_kernel(4, 64, words, rh, tiles)
    r, s, text = sc.sass(k.py_func, products)
    loop = sc.busiest_block(text)
    n = sum(loop.values())
    imma = loop["IMMA"]
    regs = -(-r // 8) * 8
    blocks = 65536 // (regs * 128)
    print(f"rows {8*rh} tiles {tiles}: {r} regs ({blocks} blocks/SM, {4*blocks} warps), spill {s}, loop {n} for {imma} IMMA: {n/imma:.1f} a IMMA; ", loop.most_common(6), flush=True)
