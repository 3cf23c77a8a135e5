"""A request and its place in a lane: what `Engine.submit` returns, how the engine follows it, the checks of its
token ids, and which rows of a round it draws where."""
import dataclasses
import queue
import threading
import time

import numpy as np

from tensorfold.errors import TensorfoldError
from tensorfold.sampling import SamplingParams, TokenHistory, is_integer

# Prompt rows a round by default, the engine's and `Model.prefill`'s: results do not depend on it. A chunk's round
# runs eagerly, so its host work is per round, and longer chunks spread it over more tokens; measured against the
# other streams' decode by `tensorfold bench chunk` (docs/performance.rst, "Prompt chunks").
PROMPT_CHUNK = 2048

FINISHED = object()  # the queue's end marker


def check_ids(ids, vocab_size: int) -> list:
    """Token ids as a list of ints; refused (TensorfoldError) unless every one is an integer in the vocabulary."""
    ids = list(ids)
    for i in ids:
        if not is_integer(i):
            raise TensorfoldError(f"token ids must be integers, got {i!r}")
        if not 0 <= i < vocab_size:
            raise TensorfoldError(f"token id {i} is outside the vocabulary (0 .. {vocab_size - 1})")
    return [int(i) for i in ids]


def check_prompt(ids, vocab_size: int) -> list:
    """A prompt's token ids (`check_ids`), refused when empty: a prompt pass needs at least one row."""
    ids = check_ids(ids, vocab_size)
    if not ids:
        raise TensorfoldError("the prompt is empty: give at least one token id")
    return ids


@dataclasses.dataclass
class RequestStats:
    rounds: int = 0
    cached_tokens: int = 0  # prompt tokens resumed from the prompt cache
    drafted: int = 0  # drafted rows verified
    accepted: int = 0  # drafted rows accepted
    draft_rounds: int = 0  # rounds that verified drafts: (accepted + draft_rounds) / draft_rounds is the mean
    #                        acceptance length, tokens per drafted round with the model's own token included
    prompt_tokens: int = 0
    output_tokens: int = 0


class Request:
    """A submitted request: iterate it for its token ids; `finish_reason` is "stop", "length" or "cancelled"."""

    def __init__(self, prompt: list, params: SamplingParams, seed: int):
        self.prompt, self.params, self.seed = prompt, params, seed
        self.stats = RequestStats(prompt_tokens=len(prompt))
        self.output: list = []
        self.logprobs: list = []  # per output token, when asked: (its log-probability, [(id, log-probability)...])
        self.prompt_logprobs: list = []  # the same per prompt token after the first, when asked
        self.history = TokenHistory(prompt)  # what the bias and penalties read
        self.matcher = params.grammar.matcher() if params.grammar is not None else None  # after the output so far
        self.finish_reason: str | None = None
        self.error: Exception | None = None
        self.submitted = time.perf_counter()
        self.first_token_at: float | None = None
        self._tokens: queue.Queue = queue.Queue()
        self._cancelled = threading.Event()
        self.listener = None  # called from the engine thread with each token and with FINISHED (the server's hook)

    def _put(self, item) -> None:
        self._tokens.put(item)
        if self.listener is not None:
            self.listener(item)

    def cancel(self) -> None:
        """Stop generating; the engine frees the stream's lane at its next round."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def __iter__(self):
        while True:
            item = self._tokens.get()
            if item is FINISHED:
                if self.error is not None:
                    raise self.error
                return
            yield item

    def result(self) -> list:
        """Wait for the end and return every generated id."""
        for _ in self:
            pass
        return self.output


class Stream:
    """A request in a lane: its cache, how much of its prompt is in, and the sampled token not yet fed back."""

    def __init__(self, request: Request, state, draft_state=None):
        self.request, self.state, self.draft_state = request, state, draft_state
        self.prompt_fed = 0
        self.prompt_rows = 0  # the prompt rows its next round feeds (`prompt_turns`)
        self.next_token: int | None = None
        self.tokens_a_draft: float | None = None  # the mean tokens a drafted round gave it (the gate reads it)
        self.drafts_measured = 0  # the drafted rounds that mean is over

    @property
    def tokens(self) -> list:
        return self.request.prompt + self.request.output


@dataclasses.dataclass
class Behind:
    """A round replayed ahead whose tokens the engine has not read yet: its streams, their windows, and the tokens."""
    streams: list
    windows: list
    drawn: object  # model.replay.Drawn


def prompt_turns(streams, chunk: int) -> list:
    """The streams that run a round, in lane order: every decoding stream, and the streams in their prompts while
    the round's `chunk` prompt rows last, the stream with the fewest prompt rows left served first (each its
    `prompt_rows`, which `Engine._window` feeds). So a round holds at most `chunk` prompt rows however many prompts
    arrive together, and a short prompt is not held up behind a long one."""
    left = chunk
    prompting = [s for s in streams if s.prompt_fed < len(s.request.prompt)]
    for stream in sorted(prompting, key=lambda s: len(s.request.prompt) - s.prompt_fed):  # (stable: lane order)
        stream.prompt_rows = min(left, len(stream.request.prompt) - stream.prompt_fed)
        left -= stream.prompt_rows
    return [s for s in streams if s.prompt_fed == len(s.request.prompt) or s.prompt_rows > 0]


def rows_to_draw(streams, windows) -> tuple:
    """(host, batch) for a round's streams and windows (`Engine._draws`): the streams that draw on the host, a row at
    a time (their logits processed, masked by a grammar or reported as logprobs, or a prompt scored), and for the
    others, in order, (stream index, the output position of each row it draws, request). A prompt chunk that does
    not end its prompt draws nothing."""
    host, batch = [], []
    for s, (stream, window) in enumerate(zip(streams, windows)):
        request, p = stream.request, stream.request.params
        prompting = stream.prompt_fed < len(request.prompt)
        scoring = prompting and p.prompt_logprobs is not None
        if prompting and stream.prompt_fed + len(window.ids) < len(request.prompt) and not scoring:
            continue
        if p.draws_on_host or scoring:
            host.append(s)
            continue
        depths = [0] if prompting else window.depths
        batch.append((s, [len(request.output) + d for d in depths], request))
    return host, batch


def draw_parameters(batch) -> tuple:
    """`sample_rows`' per-row arrays for a batch's rows: seeds, output positions, temperature, top_k, top_p, min_p."""
    rows = [(request, position) for _, positions, request in batch for position in positions]
    return (np.array([r.seed for r, _ in rows], np.uint64), np.array([n for _, n in rows], np.uint64),
            *(np.array([getattr(r.params, f) for r, _ in rows], dtype) for f, dtype in (
                ("temperature", np.float32), ("top_k", np.int32), ("top_p", np.float32), ("min_p", np.float32))))
