"""Scratch: where a 2B prefill's time goes. Each backend op timed alone over a 1,024-token prefill (8 chunks)."""
import json, os, sys, time
import numpy as np
import tensorfold
from tensorfold import bench_local as bl
from tensorfold.api import PROMPT_CHUNK

folder = bl.checkpoint_folder(sys.argv[1], 0, "/tmp/tfcache")
model = tensorfold.load(folder, backend=sys.argv[2])
rng = np.random.default_rng(0)
cfg = model.config
model.prefill(rng.integers(0, cfg.vocab_size, PROMPT_CHUNK + 8).tolist(), model.net.new_state())
out = {}
for n in (512, 2048)[:int(sys.argv[3])]:
    r = bl.prefill_rate(model, n, rng)
    out[f"untimed_{n}"] = r["seconds"]
    print("untimed", n, r["seconds"], r["tok_s"], flush=True)
net, real = model.net, model.net.ops
timer = net.ops = model.backend = bl.TimingBackend(real)
try:
    ids = rng.integers(0, cfg.vocab_size, 1024).tolist()
    state = model.net.new_state(max_rows=1024)
    t = time.perf_counter()
    real.to_host(model.prefill(ids, state))
    total = time.perf_counter() - t
finally:
    net.ops = model.backend = real
ops = sorted(((k, timer.counts[k], 1000 * v) for k, v in timer.seconds.items()), key=lambda e: -e[2])
print(f"timed 1024-token prefill: {total*1000:.1f} ms")
for k, c, ms in ops:
    print(f"  {k:24s} {c:5d} calls {ms:9.1f} ms")
out["timed_1024_ms"] = total * 1000
out["ops"] = ops
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "prefill_ops.json"), "w"), indent=1)
