"""Replayed one-stream decode rounds of bench's random 2B (a program for ncu to watch), like tools/decode_rounds.py."""
import sys
import tensorfold
from tensorfold.cli.bench.checkpoint import checkpoint_folder, default_cache
from tensorfold.engine import Engine, SamplingParams
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 40
model = tensorfold.load(checkpoint_folder("2B", 0, default_cache()), backend="cuda")
engine = Engine(model, parallel=1, context=256)
engine.submit(list(range(1, 17)), SamplingParams(max_tokens=ROUNDS + 4, draft=False, stop_ids=()))
import time
for i in range(ROUNDS):
    if i == ROUNDS // 2:
        model.backend.synchronize(); t = time.perf_counter()
    engine.run_round()
model.backend.synchronize()
print(f"{ROUNDS} rounds: {engine.graphs.recorded} recorded, {engine.graphs.replayed} replayed, "
      f"{(time.perf_counter() - t) / (ROUNDS - ROUNDS // 2) * 1e3:.3f} ms a round (second half)")
