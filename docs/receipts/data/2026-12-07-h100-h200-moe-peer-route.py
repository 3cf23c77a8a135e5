"""Scratch: the router alone, 256 experts top 8, 1 and 16 rows; device time a call; ids/weights printed as a hash."""
import sys, hashlib
import numpy as np
from tensorfold.backends import make_backend
from tensorfold.cuda.moe import route_launch
from tensorfold.cli.bench.timing import device_seconds
be = make_backend("cuda")
rng = np.random.default_rng(1)
for rows in (1, 16):
    logits = be.upload(rng.normal(size=(rows, 256)).astype(np.float32))
    ids, w = route_launch(logits, 8, stream=be.stream)
    be.synchronize()
    h = hashlib.sha1(ids.copy_to_host().tobytes() + w.copy_to_host().tobytes()).hexdigest()[:12]
    sec = device_seconds(be, lambda: route_launch(logits, 8, stream=be.stream), 200)
    print(f"route {sys.argv[1]} rows {rows}: {sec * 1e6:.2f} us  hash {h}", flush=True)
