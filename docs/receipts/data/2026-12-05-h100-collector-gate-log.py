"""Where `auto` spends its time at T=0.8 on the embedded model: bench drafter's decode() with a gate that logs every
timed round (drafted?, probe?, watched?, recorded?, seconds, wait).  usage: gate_log.py [tokens] [greedy|T=0.8]"""
import os, sys, time, collections
import tensorfold
import tensorfold.drafters as drafters
from tensorfold.drafters import make_drafter, Drafter
from tensorfold.drafters.gate import DraftGate
from tensorfold.cli.bench.drafter import decode, PROMPTS, SAMPLINGS

tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 128
sampling = SAMPLINGS[sys.argv[2] if len(sys.argv) > 2 else "T=0.8"]
log = []

class LogGate(DraftGate):
    def drafts(self, streams, tokens):
        d = super().drafts(streams, tokens)
        self.note = {"drafted": d, "probe": self.probed, "watched": False}
        return d
    def watching(self, streams):
        w = super().watching(streams)
        if w and hasattr(self, "note"):
            self.note["watched"] = True
        return w
    def finish(self, streams, drafted, recorded):
        seconds = self.clock() - self.started
        super().finish(streams, drafted, recorded)
        note = getattr(self, "note", {})
        LogGate.last_upkeep = getattr(self, "upkeep", None)
        log.append((drafted, note.get("probe"), note.get("watched"), recorded, seconds, self.wait,
                    self.seconds.get((streams, True)), self.seconds.get((streams, False))))

drafters.DraftGate = LogGate
model = tensorfold.load(None, backend=os.environ.get("BACKEND", "cuda"))
prompts = [model.tokenizer.encode(p) for p in PROMPTS]
import os
chain = make_drafter(os.path.join(model.path, "drafter"), model, "chain", None)
for attempt in range(2):
    none = decode(model, Drafter(), prompts, tokens, sampling)
    log.clear()
    auto = decode(model, chain, prompts, tokens, sampling, gated=True)
    print(f"none {none['tok_s']:.1f}  auto {auto['tok_s']:.1f} tau {auto['tau']}", flush=True)
    kinds = collections.defaultdict(list)
    for drafted, probe, watched, recorded, s, wait, dm, pm in log:
        kinds[("D" if drafted else "U") + ("p" if probe else "") + ("w" if watched else "") + ("R" if recorded else "")].append(s)
    for k, v in sorted(kinds.items()):
        print(f"  {k:5} {len(v):5} rounds, {1e3 * sum(v):8.2f} ms, mean {1e3 * sum(v) / len(v):.3f} ms", flush=True)
    print("  seq: " + "".join("D" if d else ("w" if w else ".") for d, p, w, r, *_ in log), flush=True)
    print("  wait/means at end:", log[-1][5:] if log else None, "upkeep", getattr(drafters.DraftGate, "last_upkeep", None), flush=True)
