"""Replayed one-stream decode rounds of the embedded model on the cuda backend, and nothing else: a program for a
kernel profiler to watch. Each round after the first few replays one recording, so a profiler's per-kernel times
between two draws (`argmax_part_kernel` or `sample_kernel`) are one round's kernels.

    ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip 3000 --launch-count 800 \
        python3 tools/decode_rounds.py
    ncu --clock-control none --graph-profiling graph --metrics gpu__time_duration.sum --csv python3 tools/decode_rounds.py

docs/performance.rst, "Where the time goes", has what it showed.
"""
import tensorfold
from tensorfold.engine import Engine, SamplingParams

ROUNDS = 36

model = tensorfold.load(backend="cuda")
engine = Engine(model, parallel=1, context=256)
engine.submit(list(range(1, 17)), SamplingParams(max_tokens=ROUNDS + 4, draft=False, stop_ids=()))
for _ in range(ROUNDS):
    engine.run_round()
model.backend.synchronize()
print(f"{ROUNDS} rounds: {engine.graphs.recorded} recorded, {engine.graphs.replayed} replayed")
