"""Scratch: the 2B's gate/up GEMM at 2,048, 16 and 1 rows, each launched once after a warm-up, for ncu."""
import sys
import numpy as np
from numba import cuda
from tensorfold.backends import make_backend
from tensorfold.contract.gemm import random_affine
from tensorfold.cuda import gemm

backend = make_backend("cuda")
rng = np.random.default_rng(0)
outs, columns = 12288, 2048
packed, scales, biases = random_affine(rng, outs, columns, 4, 64)
weight = [backend.upload(a) for a in (packed, scales, biases)]
for rows in [int(r) for r in sys.argv[1:]] or (2048, 16, 1):
    x = backend.upload(rng.normal(size=(rows, columns)).astype(np.float32))
    gemm.launch_gemm(x, outs, *weight, 4, 64, stream=backend.stream, gated=True)
    backend.synchronize()
    cuda.profile_start()
    gemm.launch_gemm(x, outs, *weight, 4, 64, stream=backend.stream, gated=True)
    backend.synchronize()
    cuda.profile_stop()
    print("rows", rows, "done", flush=True)
