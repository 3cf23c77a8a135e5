"""Scratch: the grouped expert GEMMs of the 35B-A3B alone (gate/up K=2048 gated, down K=512), at 1 and 16 rows
(9 and 144 pairs with the shared expert folded in), each kernel/tile variant timed on cold weights (16 id sets taken
in turn), outputs compared bit for bit with the first variant."""
import sys, json, os, types
import numpy as np
from numba import cuda
from tensorfold.backends import make_backend
from tensorfold.contract.gemm import random_affine
from tensorfold.cuda import experts as ex
from tensorfold.cuda.quantize import launch_quantize
from tensorfold.cli.bench.timing import device_seconds
from tensorfold.device.grid import flat

backend = make_backend("cuda")
stream = backend.stream
rng = np.random.default_rng(0)
E, K, HID, INTER = (256, 8, 2048, 512) if not os.environ.get("SIM") else (8, 2, 1024, 512)
COUNT = E + 1
SETS = 16 if not os.environ.get("SIM") else 2


def weight(outs, cols):
    p, s, b = random_affine(rng, outs, cols, 4, 64)
    return types.SimpleNamespace(bits=4, group_size=64, out_features=outs, data=backend.upload(p),
                                 scales=backend.upload(s), biases=backend.upload(b))


gate_up, down = weight(COUNT * 2 * INTER, HID), weight(COUNT * HID, INTER)
print("weights up", flush=True)


def call(kind, tiles, w, quantized, grouping, pairs, per_row, gated, y):
    digits, exponents, sums = quantized
    columns, x_rows = digits.shape[2], digits.shape[1]
    out_features = w.out_features // COUNT
    cnt = out_features // 2 if gated else out_features
    words, halves, _ = ex.grouped_shape(pairs, COUNT, w, columns)
    chunks = -(-columns // 512)
    args = (flat(digits).view(np.uint32), flat(exponents), flat(sums), columns, x_rows, flat(w.data),
            w.data.shape[1], flat(w.scales), flat(w.biases), w.scales.shape[1])
    written = 4 * tiles if gated else 8 * tiles
    slots = grouping.table.shape[1]
    if kind == "whole":
        f = ex.grouped_whole_kernel(4, 64, words, halves, tiles, gated)[(-(-cnt // (4 * written)), slots), 128, stream]
    else:
        f = ex.grouped_round_kernel(4, 64, words, halves, tiles, chunks, gated)[
            (-(-cnt // written), slots), chunks * 32, stream]
    f(*args, y, pairs, out_features, grouping.order, grouping.offsets, grouping.table, per_row)


res = []
for rows in (1, 16):
    pairs = rows * (K + 1)
    sets = []
    for _ in range(SETS):
        ids = np.stack([rng.permutation(E)[:K] for _ in range(rows)]).astype(np.int32)
        grouping = ex.group_launch(backend.upload(ids), COUNT, True, stream)
        x = backend.upload(rng.normal(size=(rows, HID)).astype(np.float32))
        h = backend.upload(rng.normal(size=(pairs, INTER)).astype(np.float32))
        wu = ex.grouped_shape(pairs, COUNT, gate_up, HID)[0]
        wd = ex.grouped_shape(pairs, COUNT, down, INTER)[0]
        sets.append((grouping, launch_quantize(x, 4, 64, wu, rows, stream), launch_quantize(h, 4, 64, wd, pairs, stream)))
    pick = lambda vs: [v for v in vs if len(sys.argv) < 3 or f"{v[0]}{v[1]}" in sys.argv[2].split(",")]  # noqa
    for name, w, gated, variants in (("gate_up", gate_up, True, pick([("round", 2), ("round", 4), ("whole", 2), ("whole", 4)])),
                                     ("down", down, False, pick([("whole", 2), ("whole", 4), ("round", 2), ("round", 4)]))):
        cnt = (w.out_features // COUNT) // (2 if gated else 1)
        base = None
        for kind, tiles in variants:
            ys = [cuda.device_array(pairs * cnt, np.float32, stream=stream) for _ in range(SETS)]
            turn = [0]

            def launch():
                i = turn[0] % SETS; turn[0] += 1
                g, qx, qh = sets[i]
                call(kind, tiles, w, qx if gated else qh, g, pairs, K + 1 if gated else 1, gated, ys[i])
            try:
                for _ in range(SETS):
                    launch()
                backend.synchronize()
                got = [y.copy_to_host() for y in ys]
                same = base is None or all(np.array_equal(a, b) for a, b in zip(got, base))
                if base is None:
                    base = got
                sec = device_seconds(backend, launch, 64 if not os.environ.get("SIM") else 1)
                nbytes = 0
                print(f"rows {rows:2d} {name:8s} {kind:5s} tiles {tiles}: {sec * 1e6:8.1f} us  same={same}", flush=True)
                res.append(dict(rows=rows, gemm=name, kind=kind, tiles=tiles, us=sec * 1e6, same=same))
            except Exception as e:  # noqa
                print(f"rows {rows:2d} {name:8s} {kind:5s} tiles {tiles}: ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "sweep-" + sys.argv[1] + ".json"), "w"), indent=1)
