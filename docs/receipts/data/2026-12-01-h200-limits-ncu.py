"""Scratch: one launch of each GEMV shape, for ncu."""
import numpy as np
from numba import cuda
from tensorfold.bench_local import random_affine
from tensorfold.cuda import gemv
from tensorfold.cuda.gemv import bf16_to_f32

rng = np.random.default_rng(0)
for rows, out, k, gated in [(1, 2048, 6144, False), (1, 6144, 2048, False), (1, 12288, 2048, True),
                            (1, 248320, 2048, False), (16, 6144, 2048, False), (16, 12288, 2048, False),
                            (16, 248320, 2048, False)]:
    packed, scales, biases = random_affine((out, k), 0.02, rng)
    d = [cuda.to_device(a) for a in (packed, bf16_to_f32(scales), bf16_to_f32(biases))]
    x = cuda.to_device(rng.normal(size=(rows, k)).astype(np.float32))
    for _ in range(2):
        gemv.launch_gemv(gemv.gemv_affine_kernel, x, out, *d, 4, 64, gated=gated)
    cuda.synchronize()
    print(rows, out, k, gated, flush=True)
