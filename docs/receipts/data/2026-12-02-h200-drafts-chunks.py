"""Scratch: cold prefill tok/s of a random 2B checkpoint at several prompt-chunk sizes (Model.prefill's PROMPT_CHUNK),
and that every chunk size gives the same last logits bytes."""
import hashlib, json, os, sys
import numpy as np
import tensorfold
from tensorfold import api, bench_local as bl

model = tensorfold.load(bl.checkpoint_folder(sys.argv[1], 0, "/tmp/tfcache"), backend=sys.argv[2])
lengths = [int(n) for n in sys.argv[3].split(",")]
chunks = [int(n) for n in sys.argv[4].split(",")]
rng = np.random.default_rng(0)
out = []
for chunk in chunks:
    api.PROMPT_CHUNK = chunk
    model.prefill(rng.integers(0, model.config.vocab_size, chunk + 8).tolist(), model.net.new_state())  # warm-up
    for length in lengths:
        ids = np.random.default_rng(length).integers(0, model.config.vocab_size, length).tolist()
        r = bl.prefill_rate(model, length, np.random.default_rng(length))
        state = model.net.new_state(max_rows=length)
        digest = hashlib.sha256(model.backend.to_host(model.prefill(ids, state)).tobytes()).hexdigest()[:16]
        out.append({"chunk": chunk, "tokens": length, "seconds": r["seconds"], "tok_s": r["tok_s"], "logits": digest})
        print(out[-1], flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "chunks.json"), "w"), indent=1)
