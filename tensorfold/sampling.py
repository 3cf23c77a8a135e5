"""What a request asks of the draw (`SamplingParams`), and what happens to a row of logits before it is drawn from.

The draw itself (temperature, top-k, top-p, min-p and the seeded uniform) is `tensorfold/cuda/sampling.py`'s. Before
it, `process_logits` changes a row's logits by the request's settings and the tokens before the row, in vLLM's
order:

1. ``logit_bias``: bias[id] is added to the logit of id;
2. ``repetition_penalty`` p (HF and vLLM): the logit of every token in the prompt or the output so far is divided
   by p when it is positive and multiplied by p otherwise;
3. ``presence_penalty`` and ``frequency_penalty``: subtracted from the logit of every token in the output so far,
   the second once per time it was generated.

Each step reads only the settings and the row's token history, which a drafted row and the one-row step it stands
for share (`Engine` draws such rows one at a time, as its walk reaches them), so drafted output equals undrafted.
"""
import dataclasses
import numbers

import numpy as np

from tensorfold.errors import TensorfoldError
from tensorfold.grammar import Grammar

BIAS_LIMIT = 100  # |logit_bias| at most this, as OpenAI
REPETITION_RANGE = (0.01, 100.0)  # repetition_penalty; the bounds keep every penalised logit finite


def is_integer(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclasses.dataclass
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None  # None: a random seed; the draws read it modulo 2^64
    stop_ids: tuple | None = None  # None: the model's own stop ids
    draft: bool = True
    presence_penalty: float = 0.0  # subtracted from a token's logit once it has been generated
    frequency_penalty: float = 0.0  # subtracted once per time it has been generated
    logprobs: int | None = None  # None: none; k >= 0: the chosen token's log-probability and the top k
    logit_bias: dict | None = None  # token id -> added to its logit, -100 to 100
    repetition_penalty: float = 1.0  # 1: off
    prompt_logprobs: int | None = None  # None: none; k >= 0: each prompt token's log-probability and the top k
    grammar: Grammar | None = None  # None: any token; else only what the grammar allows (tensorfold/grammar.py)

    def problems(self) -> dict:
        """What is wrong with these parameters, by field (empty when nothing is). Every request passes this one
        check: through `Model.generate`, the engine and the server alike. Token ids are checked against the
        vocabulary by `Engine.submit`."""
        found = {}
        if not (is_integer(self.max_tokens) and self.max_tokens >= 1):
            found["max_tokens"] = f"max_tokens must be a positive integer, got {self.max_tokens!r}"
        if not (is_real(self.temperature) and 0 <= self.temperature <= 100):
            found["temperature"] = f"temperature must be between 0 and 100, got {self.temperature!r}"
        if not (is_real(self.top_p) and 0 < self.top_p <= 1):
            found["top_p"] = f"top_p must be in (0, 1], got {self.top_p!r}"
        if not (is_integer(self.top_k) and 0 <= self.top_k < 2**31):  # the draws take it as an int32
            found["top_k"] = f"top_k must be an integer from 0 (off) to 2^31 - 1, got {self.top_k!r}"
        if not (is_real(self.min_p) and 0 <= self.min_p <= 1):
            found["min_p"] = f"min_p must be in [0, 1], got {self.min_p!r}"
        if self.seed is not None and not (is_integer(self.seed) and -2**63 <= self.seed < 2**64):
            found["seed"] = f"seed must be an integer in [-2^63, 2^64), got {self.seed!r}"
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (is_real(value) and -2 <= value <= 2):
                found[name] = f"{name} must be between -2 and 2, got {value!r}"
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not (is_integer(value) and 0 <= value <= 20):
                found[name] = f"{name} must be an integer between 0 and 20, got {value!r}"
        low, high = REPETITION_RANGE
        if not (is_real(self.repetition_penalty) and low <= self.repetition_penalty <= high):
            found["repetition_penalty"] = (f"repetition_penalty must be between {low} and {high:g} (1 is off), got "
                                           f"{self.repetition_penalty!r}")
        if self.logit_bias is not None:
            bad = next((f"{i!r}: {b!r}" for i, b in self.logit_bias.items()
                        if not (is_integer(i) and is_real(b) and -BIAS_LIMIT <= b <= BIAS_LIMIT)), None) \
                if isinstance(self.logit_bias, dict) else repr(self.logit_bias)
            if bad is not None:
                found["logit_bias"] = (f"logit_bias must map token ids to numbers from -{BIAS_LIMIT} to "
                                       f"{BIAS_LIMIT}, got {bad}")
        return found

    def check(self) -> None:
        """Refuse (TensorfoldError) parameters with any of `problems`, naming each."""
        found = self.problems()
        if found:
            raise TensorfoldError("; ".join(found.values()))

    @property
    def processes_logits(self) -> bool:
        """Whether `process_logits` changes a row: its draws then run on the host, a row at a time."""
        return bool(self.logit_bias or self.repetition_penalty != 1 or self.presence_penalty
                    or self.frequency_penalty)

    @property
    def draws_on_host(self) -> bool:
        """Whether its rows are drawn on the host, a row at a time: its logits processed, masked by a grammar, or
        reported as logprobs."""
        return self.processes_logits or self.logprobs is not None or self.grammar is not None


class TokenHistory:
    """The tokens before a request's next row: the prompt's distinct ids, and each output token's count."""

    def __init__(self, prompt: list):
        self.seen = dict.fromkeys(prompt)  # every distinct id of the prompt and the output, in order of arrival
        self.counts: dict = {}  # output token -> times generated

    def add(self, token: int) -> None:
        self.seen[token] = None
        self.counts[token] = self.counts.get(token, 0) + 1


def process_logits(logits_row, params: SamplingParams, history: TokenHistory) -> np.ndarray:
    """The row's logits after the request's bias and penalties (the module's docstring gives the order), in
    float32; the row itself when nothing applies."""
    if not params.processes_logits:
        return logits_row
    row = np.array(logits_row, np.float32, copy=True)
    if params.logit_bias:
        ids = np.fromiter(params.logit_bias, np.int64)
        row[ids] += np.fromiter(params.logit_bias.values(), np.float32)
    if params.repetition_penalty != 1:
        seen = np.fromiter(history.seen, np.int64)
        penalty, values = np.float32(params.repetition_penalty), row[seen]
        row[seen] = np.where(values > 0, values / penalty, values * penalty)
    if (params.presence_penalty or params.frequency_penalty) and history.counts:
        generated = np.fromiter(history.counts, np.int64)
        times = np.fromiter(history.counts.values(), np.float32)
        row[generated] -= np.float32(params.presence_penalty) + np.float32(params.frequency_penalty) * times
    return row


def log_probabilities(logits_row, token: int, top: int) -> tuple:
    """(log-probability of `token`, the `top` most likely (id, log-probability) pairs) under softmax(logits), in
    float64; ties in the top list go to the lower id."""
    row = np.asarray(logits_row, np.float64)
    shifted = row - row.max()
    logp = shifted - np.log(np.exp(shifted).sum())
    best = np.argsort(-logp, kind="stable")[:top]
    return float(logp[token]), [(int(i), float(logp[i])) for i in best]


def prompt_log_probabilities(logits_rows, prompt: list, start: int, top: int) -> list:
    """`log_probabilities` of each prompt token after `start` that the rows predict: rows[i] holds the logits at
    prompt position start + i, which predict the token at start + i + 1 (the prompt's last row predicts none)."""
    return [log_probabilities(row, prompt[start + i + 1], top)
            for i, row in enumerate(logits_rows) if start + i + 1 < len(prompt)]
