"""Scratch: attention partial, per-row kernel against the tile kernel, for chains of 2..16 rows at 2B shapes."""
import numpy as np
from numba import cuda
from tensorfold.cuda import attention as A
from tensorfold.device.grid import flat
from tensorfold.backends.cuda_backend import CudaBackend
from tensorfold.cli.bench.timing import device_seconds

be = CudaBackend()
rng = np.random.default_rng(0)
heads, kv, hd = 8, 2, 256
for cache in (1024, 8192):
    keys = cuda.to_device(rng.normal(size=(cache, kv, hd)).astype(np.float32))
    values = cuda.to_device(rng.normal(size=(cache, kv, hd)).astype(np.float32))
    for rows in (2, 4, 8, 16):
        committed = cache // 2
        n = cuda.to_device(np.arange(committed + 1, committed + rows + 1, dtype=np.int32))
        q = cuda.to_device(rng.normal(size=(rows, heads, hd)).astype(np.float32))
        chunks = -(-cache // A.CHUNK)
        m = cuda.device_array((rows, heads, chunks), np.float32); l = cuda.device_array((rows, heads, chunks), np.float32)
        o = cuda.device_array((rows, heads, chunks, hd), np.float32)
        slots = cuda.device_array((rows, 1), np.int32)
        s = be.stream
        def per_row():
            A.attention_partial_kernel[(chunks, heads, rows), A.CHUNK, s](flat(q), flat(keys), flat(values), heads, kv, hd, n, n, slots, 0.0625, A.CHUNK, m, l, o)
        def tile():
            A.attention_partial_tile_kernel[(chunks, heads, -(-rows // A.ROWS_A_BLOCK)), A.CHUNK, s](flat(q), flat(keys), flat(values), heads, kv, hd, n, 0.0625, A.CHUNK, m, l, o)
        a, b = device_seconds(be, per_row, 50), device_seconds(be, tile, 50)
        print(f"cache {cache} keys ~{committed}, {rows:2d} rows: per-row {1e6*a:7.1f} us, tile {1e6*b:7.1f} us", flush=True)
