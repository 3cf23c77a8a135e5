"""Time the DeltaNet scan kernel of variant copies of cuda/deltanet.py on one window, check their bits against the
first (main) and against the twin on a tree. usage: scanbench.py rows reps name=path ..."""
import importlib.util, sys, time
import numpy as np
from numba import cuda
from tensorfold.numerics import paths
from tensorfold.cuda import deltanet as twin_module

def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m

rows, reps = int(sys.argv[1]), int(sys.argv[2])
variants = [(a.split("=")[0], load(*a.split("="))) for a in sys.argv[3:]]
nk, nv, dk, dv = (2, 4, 8, 40) if rows < 64 else (16, 16, 128, 128)
rng = np.random.default_rng(0)
def unit(x): return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)
q, k = unit(rng.standard_normal((rows, nk, dk))), unit(rng.standard_normal((rows, nk, dk)))
v = rng.standard_normal((rows, nv, dv)).astype(np.float32)
decay = rng.uniform(0.8, 1.0, (rows, nv)).astype(np.float32)
beta = rng.uniform(0.1, 0.9, (rows, nv)).astype(np.float32)
state = (0.1 * rng.standard_normal((nv, dk, dv))).astype(np.float32)
dev = [cuda.to_device(a) for a in (state, q, k, v, decay, beta)]
results = {}
for name, m in variants:
    outs = m.deltanet_scan_launch(*dev)
    cuda.synchronize()
    host = [outs[0].copy_to_host(), outs[1].copy_to_host()] + [x.copy_to_host() for x in outs[2]]
    times = []
    for _ in range(reps):
        a, b = cuda.event(), cuda.event()
        a.record(); m.deltanet_scan_launch(*dev); b.record(); b.synchronize()
        times.append(a.elapsed_time(b))
    same = "" if not results else ("bit-equal" if all(np.array_equal(x, y) for x, y in zip(host, results["main"])) else "DIFFERS")
    results.setdefault("main", host)
    print(f"{name}: rows {rows} (nv {nv} dk {dk} dv {dv}): min {min(times):.3f} ms, median {sorted(times)[len(times)//2]:.3f} ms {same}", flush=True)
# a tree window against the twin
tree = [-1, 0, 1, 1, 3, 0, 5, 6][: min(8, rows)]
depths, slots = paths.depths(tree), paths.path_slots(tree)
n = len(tree)
want = twin_module.deltanet_scan(state, q[:n], k[:n], v[:n], decay[:n], beta[:n], depths, slots)
for name, m in variants:
    got = m.deltanet_scan_launch(*[cuda.to_device(a) for a in (state, q[:n], k[:n], v[:n], decay[:n], beta[:n], depths, slots)])
    ok = np.array_equal(got[0].copy_to_host(), want[0]) and np.array_equal(got[1].copy_to_host(), want[1]) and np.array_equal(got[2][1].copy_to_host(), want[2][1])
    print(f"{name}: tree of {n} rows against the twin: {'bit-equal' if ok else 'DIFFERS'}", flush=True)
