"""Scratch: one GEMM of a shape (rows, outputs, K, gated) launched once after a warm-up, for ncu."""
import sys
import numpy as np
from numba import cuda
from tensorfold.backends import make_backend
from tensorfold.contract.gemm import random_affine
from tensorfold.cuda import gemm

backend = make_backend("cuda")
rng = np.random.default_rng(0)
rows, outs, columns, gated = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "gated"
weight = [backend.upload(a) for a in random_affine(rng, outs, columns, 4, 64)]
x = backend.upload(rng.normal(size=(rows, columns)).astype(np.float32))
gemm.launch_gemm(x, outs, *weight, 4, 64, stream=backend.stream, gated=gated)
backend.synchronize()
cuda.profile_start()
gemm.launch_gemm(x, outs, *weight, 4, 64, stream=backend.stream, gated=gated)
backend.synchronize()
cuda.profile_stop()
