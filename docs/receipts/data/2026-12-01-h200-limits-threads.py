"""Scratch: the GEMV walk with more threads an output. env T (threads an output), W (warps a block: groups of T),
RO RS (outputs and chunks a step of a wide one-row call), NO NS (of a narrow one), ROWS (streams list)."""
import json
import os

import numpy as np

from tensorfold.cuda import gemv

T = int(os.environ.get("T", 32))
gemv.THREADS, gemv.ROUND, gemv.ROUND_PAIRS = T, T * gemv.CHUNK, T * gemv.CHUNK // 2
gemv.WARPS = int(os.environ.get("W", 4))
gemv.ROW_OUTPUTS, gemv.ROW_STEP = int(os.environ.get("RO", 4)), int(os.environ.get("RS", 4))
gemv.NARROW_OUTPUTS, gemv.NARROW_STEP = int(os.environ.get("NO", 2)), int(os.environ.get("NS", 8))
label = " ".join(f"{k}={os.environ.get(k, '-')}" for k in ("T", "W", "RO", "RS", "NO", "NS"))

from numba import cuda  # noqa: E402
from tensorfold import bench_local  # noqa: E402
from tensorfold.bench_local import random_affine  # noqa: E402
from tensorfold.cuda.gemv import bf16_to_f32  # noqa: E402

rng = np.random.default_rng(0)
checks = []
for rows, out, k in [(1, 2048, 6144), (1, 6144, 2048), (1, 16384, 2048), (4, 2048, 2048), (16, 12288, 2048),
                     (16, 2048, 6144)]:
    packed, scales, biases = random_affine((out, k), 0.02, rng)
    scales, biases = bf16_to_f32(scales), bf16_to_f32(biases)
    x = rng.normal(size=(rows, k)).astype(np.float32)
    got = gemv.launch_gemv(gemv.gemv_affine_kernel, cuda.to_device(x), out, *(cuda.to_device(a) for a in (packed, scales, biases)), 4, 64).copy_to_host()
    want = gemv.gemv_affine(x, packed, scales, biases, 4, 64)
    checks.append(bool(np.array_equal(got.view(np.uint32), want.view(np.uint32))))
print(label, "twin-equal:", checks, flush=True)

import tensorfold  # noqa: E402
model = tensorfold.load(bench_local.checkpoint_folder("2B", 0, "/tmp/tfcache"), backend="cuda")
out = {"label": label}
for streams in [int(s) for s in os.environ.get("ROWS", "1,16").split(",")]:
    level = bench_local.decode_rate(model, streams, 64, 2, 32, rng)
    out[streams] = level["ms_per_round"]
    print(f"{label} x{streams}: {level['ms_per_round']:.3f} ms a round, {level['tok_s']:.1f} tok/s", flush=True)
print("JSON", json.dumps(out))
