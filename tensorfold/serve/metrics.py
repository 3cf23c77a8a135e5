"""Prometheus text exposition of the server's counters, gauges and latency histograms (no client library: the
format is a few lines of text)."""
import threading
from typing import ClassVar

BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Histogram:
    def __init__(self):
        self.counts, self.total, self.count = [0] * len(BUCKETS), 0.0, 0

    def observe(self, seconds: float) -> None:
        for i, bound in enumerate(BUCKETS):
            if seconds <= bound:
                self.counts[i] += 1
        self.total += seconds
        self.count += 1

    def lines(self, name: str) -> list:
        out = [f'{name}_bucket{{le="{bound}"}} {n}' for bound, n in zip(BUCKETS, self.counts)]
        return out + [f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {self.total:.6f}",
                      f"{name}_count {self.count}"]


class Metrics:
    """What /metrics reports: request and token counts, rounds, drafts and acceptance, queue depth,
    prompt-cache hits, and latency histograms."""

    COUNTERS: ClassVar[dict] = {"requests_total": "finished requests", "request_errors_total": "requests refused or failed",
                "prompt_tokens_total": "prompt tokens", "generation_tokens_total": "generated tokens",
                "drafted_rows_total": "drafted rows verified", "accepted_rows_total": "drafted rows accepted",
                "draft_rounds_total": "rounds that verified drafts (mean acceptance length: "
                                      "(accepted_rows + draft_rounds) / draft_rounds)",
                "prompt_cache_hits_total": "requests resumed from the prompt cache"}

    def __init__(self):
        self.lock = threading.Lock()
        self.values = dict.fromkeys(self.COUNTERS, 0)
        self.latency, self.first_token = Histogram(), Histogram()

    def add(self, name: str, amount: int = 1) -> None:
        with self.lock:
            self.values[name] += amount

    def render(self, engine) -> str:
        lines = []
        with self.lock:
            for name, text in self.COUNTERS.items():
                lines += [f"# HELP tensorfold_{name} {text}", f"# TYPE tensorfold_{name} counter",
                          f"tensorfold_{name} {self.values[name]}"]
            gauges = {"rounds_total": ("lane rounds run", "counter", engine.rounds),
                      "queue_depth": ("requests waiting for a lane", "gauge", engine.queue_depth),
                      "active_streams": ("streams in lanes", "gauge", len(engine.active))}
            for name, (text, kind, value) in gauges.items():
                lines += [f"# HELP tensorfold_{name} {text}", f"# TYPE tensorfold_{name} {kind}",
                          f"tensorfold_{name} {value}"]
            for name, histogram, text in (("request_seconds", self.latency, "request latency"),
                                          ("time_to_first_token_seconds", self.first_token, "time to first token")):
                lines += [f"# HELP tensorfold_{name} {text}", f"# TYPE tensorfold_{name} histogram"]
                lines += histogram.lines(f"tensorfold_{name}")
        return "\n".join(lines) + "\n"
