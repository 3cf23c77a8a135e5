import sys
sys.path.insert(0, "tools")  # run from the repository root
import sass_counts as sc
root = sys.argv[1]
sc.without_a_device()
sys.path.insert(0, root)
from numba import types
from tensorfold.cuda import gemm
assert gemm.__file__.startswith(root), gemm.__file__
u32, i32, f32, f64 = (getattr(types, n)[::1] for n in ("uint32", "int32", "float32", "float64"))
I = types.int64
rounds = (u32, i32, i32, I, I, u32, I, f32, f32, I, I, I, f32, I, I, I)
comb = (f64, I, I, I, f32, I, I, I)
for name, k, sig in [("round 1 row", gemm.round_kernel(4, 64, 4, 1, 2, 4, False), rounds),
                     ("round 16 rows gated", gemm.round_kernel(4, 64, 4, 2, 2, 4, True), rounds),
                     ("combine", gemm.combine_kernel(False), comb), ("combine gated", gemm.combine_kernel(True), comb)]:
    regs, spill, text = sc.sass(k.py_func, sig)
    ops = [m.group(1) for m in map(sc.INSTRUCTION.search, text.splitlines()) if m]
    print(name, regs, spill, len(ops))
