"""The gate's decisions on the embedded model (numpy backend) with a clock that charges each round the GPU's costs:
which rounds drafted, the tokens they gave, and the simulated rate against chains and undrafted."""
import os, sys
import tensorfold
from tensorfold.cli.bench.drafter import PROMPTS, SAMPLINGS
from tensorfold.drafters import DraftGate, make_drafter
from tensorfold.engine import Engine, SamplingParams
from tensorfold.model.replay import MAX_ROWS

PLAIN, DRAFTED = float(sys.argv[1]), float(sys.argv[2])  # ms of an undrafted and a drafted round
sampling = SAMPLINGS[sys.argv[3]] if len(sys.argv) > 3 else SAMPLINGS["greedy"]
WATCH_MS = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0  # cost of showing an undrafted round's rows

if os.environ.get("ALWAYS_WATCH"):
    DraftGate.watching = lambda self, streams: True

class Charged(DraftGate):
    def __init__(self):
        super().__init__(clock=lambda: 0.0)
        self.log = []
    def finish(self, streams, drafted, recorded):
        watching = not drafted and self.watching(streams)
        self.started = -(DRAFTED if drafted else PLAIN + (WATCH_MS if watching else 0)) / 1000
        self.log.append("D" if drafted else ("w" if watching else "."))
        super().finish(streams, drafted, recorded)

model = tensorfold.load(os.path.join(os.path.dirname(tensorfold.__file__), "models", "tiny-shakespeare"), backend="numpy")
chain = make_drafter(os.path.join(model.path, "drafter"), model, "chain", None)
prompts = [model.tokenizer.encode(p) for p in PROMPTS[:4]]
gate = Charged()
engine = Engine(model, parallel=1, drafter=chain, context=max(map(len, prompts)) + 128 + MAX_ROWS, gate=gate)
total_ms = tokens = 0
for prompt in [prompts[0]] + prompts:
    r = engine.submit(prompt, SamplingParams(max_tokens=128, stop_ids=(), **sampling))
    start = len(gate.log)
    gains = []
    while True:
        before = len(r.output)
        if not engine.run_round():
            break
        if len(gate.log) > start + len(gains):
            gains.append(len(r.output) - before)
    print(" ".join(f"{c}{g}" if c == "D" else c for c, g in zip(gate.log[start:], gains)))
ms = sum(DRAFTED if c == "D" else PLAIN + (WATCH_MS if c == "w" else 0) for c in gate.log)
print("drafted", gate.log.count("D"), "watched", gate.log.count("w"), "plain", gate.log.count("."))
