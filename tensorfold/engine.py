"""Lane rounds: every active stream's window goes through one forward, then each stream keeps its accepted rows.

A stream's window is, each round, one of:

* a prompt chunk (the streams in their prompts share `chunk` rows a round, the stream with the fewest prompt rows
  left first; a stream left without rows sits the round out),
* one decode row (the token sampled last round, fed back), or
* a drafted chain: that decode row followed by the drafter's guesses of the next tokens (up to `max_draft`).

After the forward the engine samples the model at every row of a drafted chain, with the draw for output position
n depending only on (seed, n), and accepts the guesses while they equal the model's own tokens; the model's token
at the first mismatch is the next decode row. So drafted output equals undrafted output, and a stream's output
does not depend on which streams share its rounds: every row's logits are the bits a one-row step would give.

`Engine` owns a model, runs rounds on one thread, and hands each request its tokens through a queue. Each of its
`parallel` lanes keeps its cache and drafter state from request to request, reset in place, so the recordings made
on the lane's buffers (model/replay.py, drafters/replay.py) replay for every request the lane serves.

Rounds replayed ahead (`ahead`, off by default): when every stream decodes one undrafted row drawn on the device,
round n + 1 (its ids read on the device) is issued before round n's tokens are read (`_run_behind`; docs/
architecture.rst, "Rounds replayed ahead").
"""
import os
import secrets
import threading
import time

from tensorfold.device.collector import settle
from tensorfold.drafters.base import Drafter
from tensorfold.drafters.gate import DraftGate
from tensorfold.errors import TensorfoldError
from tensorfold.model.cache import KeepPolicy, pending_row_bytes
from tensorfold.model.replay import MAX_ROWS, DecodeGraphs, replays_decode_rounds
from tensorfold.model.rows import Window
from tensorfold.request import (FINISHED, PROMPT_CHUNK, Behind, Request, Stream, check_ids, check_prompt,
                                draw_parameters, prompt_turns, rows_to_draw)
from tensorfold.sampling import SamplingParams, log_probabilities, process_logits, prompt_log_probabilities


class Engine:
    """Up to `parallel` streams, each running one window per round through one forward of the model."""

    def __init__(self, model, parallel: int = 4, chunk: int = PROMPT_CHUNK, context: int | None = None,
                 drafter: Drafter | None = None, max_draft: int = 15, prompt_cache=None,
                 keep: KeepPolicy | None = None, graphs: bool | None = None, gate: DraftGate | None = None,
                 ahead: bool | None = None):
        if parallel < 1 or chunk < 1 or max_draft < 0:
            raise TensorfoldError(f"parallel ({parallel}) and chunk ({chunk}) must be positive, max_draft "
                                  f"({max_draft}) non-negative")
        self.model, self.parallel, self.chunk, self.max_draft = model, parallel, chunk, max_draft
        self.context = context or model.config.max_position_embeddings
        if self.context > model.config.max_position_embeddings:
            raise TensorfoldError(f"context {self.context} exceeds the model's max_position_embeddings "
                                  f"({model.config.max_position_embeddings})")
        self.drafter = drafter or Drafter()
        self.window_rows = min(1 + max_draft, MAX_ROWS, self.drafter.window_rows or MAX_ROWS)
        self.gate = gate  # with a gate, a decode round drafts only while drafting pays (drafters/gate.py); else always
        self.keep = keep or KeepPolicy(late=os.environ.get("TENSORFOLD_KEEP_LATE", "1") != "0")
        self.prompt_cache = prompt_cache  # a PromptCache, or None
        # decode rounds, drafted or not, replayed from CUDA graphs (model/replay.py): on the GPU, unless turned off
        self.graphs = DecodeGraphs(model.net, lanes=parallel) if replays_decode_rounds(model.backend, graphs) else None
        # undrafted one-row rounds replayed ahead of their tokens (the module's docstring), with recordings, when
        # `ahead` is True, or None with TENSORFOLD_AHEAD=1: off by default, slower as measured (docs/performance.rst)
        self.pipelined = self.graphs is not None and (
            ahead if ahead is not None else os.environ.get("TENSORFOLD_AHEAD", "0") == "1")
        self.behind = None  # the round replayed ahead, its tokens not read yet (a Behind)
        self.decided = None  # (streams, drafting, timed): what `_drafting` said in a round that had to wait for it
        self.waiting: list = []
        self.active: list = []  # in lane order
        self.lanes: list = []  # each lane's cache, reset in place for each request it takes (the module's docstring)
        self.drafts: dict = {}  # lane index -> the drafter state its last drafting request used
        self.rounds, self.settled = 0, 0  # rounds run; recordings made when the collector last settled
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._running = False
        self.failure: BaseException | None = None  # what stopped the engine thread, if anything did

    # --- requests ---------------------------------------------------------------------------------------------

    def submit(self, prompt, params: SamplingParams | None = None, listener=None) -> Request:
        """Queue a request; refused at once (TensorfoldError) if it cannot run. `listener`, if given, is called
        from the engine thread with every token and finally with FINISHED."""
        if self.failure is not None:
            raise TensorfoldError(f"the engine has stopped: {self.failure!r}")
        params = params or SamplingParams()
        params.check()
        prompt = list(prompt)
        if len(prompt) + params.max_tokens > self.context:  # before the ids are read: a long prompt costs no scan
            raise TensorfoldError(
                f"This model's maximum context length is {self.context} tokens. However, you requested "
                f"{len(prompt) + params.max_tokens} tokens ({len(prompt)} in the messages, {params.max_tokens} in "
                f"the completion). Please reduce the length of the messages or completion.")
        prompt = check_prompt(prompt, self.model.config.vocab_size)
        check_ids(params.logit_bias or (), self.model.config.vocab_size)
        seed = secrets.randbits(63) if params.seed is None else int(params.seed) % 2**64
        request = Request(prompt, params, seed)
        request.listener = listener
        with self._lock:
            self.waiting.append(request)
            self._lock.notify_all()
        return request

    def generate(self, prompt, params: SamplingParams | None = None) -> list:
        """Submit and wait (runs rounds on this thread when the engine has no thread of its own)."""
        request = self.submit(prompt, params)
        while self._thread is None and request.finish_reason is None:
            self.run_round()
        return request.result()

    # --- rounds -----------------------------------------------------------------------------------------------

    def run_round(self) -> bool:
        """One round over every active stream; returns False when there was nothing to do."""
        if self._recordings() != self.settled:  # what the rounds since made lives long (device/collector.py)
            self.settled = self._recordings()
            settle()
        with self._lock:
            while self.waiting and len(self.active) < self.parallel:
                self.active.append(self._admit(self.waiting.pop(0)))
            self.active.sort(key=lambda s: self.lanes.index(s.state))  # the same lanes, the same recording key
            for stream in [s for s in self.active if s.request.cancelled]:
                self._finish(stream, "cancelled")
            streams = prompt_turns(list(self.active), self.chunk)
        if not streams and self.behind is None:
            return False
        decided, self.decided = self.decided, None
        drafting, timed = decided[1:] if decided is not None and decided[0] == streams else self._drafting(streams)
        if self.behind is not None:
            return self._run_behind(streams, drafting, timed)
        if self._goes_ahead(streams, drafting):  # issued, and its tokens read by the next call (`_run_behind`)
            try:
                self.behind = self._replay_ahead(streams, [self._window(stream, False) for stream in streams])
            except Exception as error:  # noqa: BLE001 (a failed round ends its streams with the error)
                for stream in streams:
                    self._finish(stream, "error", error)
            return True
        if timed:
            self.gate.start()
            recordings = self._recordings()
        windows = [self._window(stream, drafting) for stream in streams]
        try:
            planned = None  # (host, batch, tokens) of a replayed round, which draws in its replay if it can
            if self.graphs is not None and self.graphs.eligible(windows):  # replayed (a one-row round's keep too)
                host, batch = rows_to_draw(streams, windows)
                logits, starts, drawn = self.graphs.run(windows, self.drafter.taps,
                                                        None if host else draw_parameters(batch))
                planned = (host, batch, None if drawn is None else drawn.tokens())
            else:
                logits, starts = self.model.net.forward_logits(windows, taps=self.drafter.taps)
            draws = self._draws(streams, windows, logits, starts, planned)
        except Exception as error:  # noqa: BLE001 (a failed round ends its streams with the error; they serve on)
            for stream in streams:
                self._finish(stream, "error", error)
            return True
        observes = drafting or self.gate is None or self.gate.watching(len(streams))
        for stream, window, draw in zip(streams, windows, draws):
            try:
                self._after(stream, window, draw, drafting, observes)
            except Exception as error:  # noqa: BLE001 (one stream's failure ends that request only)
                self._finish(stream, "error", error)
        if self.graphs is not None:
            self.graphs.keep_round()  # a replayed drafted round's keeps, recorded: one replay for every stream
        if timed:
            self.gate.finish(len(streams), drafting, self._recordings() != recordings)
        self.rounds += 1
        return True

    def _run_behind(self, streams, drafting: bool, timed: bool) -> bool:
        """While the round replayed ahead runs: when the same streams decode on, undrafted, the next round goes ahead
        too (its ids those the round behind drew, on the device), then the round behind's tokens are handed out.
        Otherwise only they are, and the next call runs the round `_drafting` decided here."""
        behind, self.behind = self.behind, None
        if timed:
            self.gate.start()
            recordings = self._recordings()
        try:
            if streams == behind.streams and self._goes_ahead(streams, drafting):
                windows = [Window(stream.state, [0], "all") for stream in streams]  # the ids: on the device
                if self.graphs.follows(windows, self.drafter.taps):
                    self.behind = self._replay_ahead(streams, windows, follows=True)
            tokens = behind.drawn.tokens()
        except Exception as error:  # noqa: BLE001 (a failed round ends its streams with the error)
            self.behind = None
            for stream in behind.streams:
                self._finish(stream, "error", error)
            return True
        for n, (stream, window) in enumerate(zip(behind.streams, behind.windows)):
            if stream.request.finish_reason is not None:  # it ended while this round ran ahead: nothing to keep
                continue
            try:
                self._after(stream, window, [int(tokens[n])].__getitem__,
                            observes=self.gate is None or self.gate.watching(len(behind.streams)))
            except Exception as error:  # noqa: BLE001 (one stream's failure ends that request only)
                self._finish(stream, "error", error)
        if self.behind is None:  # the next call runs the round decided here
            self.decided = (streams, drafting, timed)
        elif timed:
            self.gate.finish(len(streams), False, self._recordings() != recordings)
        self.rounds += 1
        return True

    def _goes_ahead(self, streams, drafting: bool) -> bool:
        """Whether a round of these streams replays ahead of its tokens: rounds are pipelined, and every stream
        decodes (its prompt in), drafts nothing and draws on the device."""
        if not self.pipelined:
            return False
        for stream in streams:
            request, p = stream.request, stream.request.params
            if (stream.prompt_fed < len(request.prompt) or p.draws_on_host
                    or (p.draft and drafting and self.drafter.proposes)):
                return False
        return True

    def _replay_ahead(self, streams, windows, follows: bool = False) -> Behind:
        """Replay a one-row round without waiting; each row is kept at once (the device holds it). `follows`: its ids
        are the tokens the round behind drew, so its draws are one output position further."""
        batch = [(s, [n + int(follows) for n in positions], request) for s, positions, request in
                 rows_to_draw(streams, windows)[1]]
        _, _, drawn = self.graphs.run(windows, self.drafter.taps, draw_parameters(batch), ahead=follows)
        for stream, window in zip(streams, windows):
            window.issued_at = stream.state.length
            stream.state.keep(1)
        return Behind(streams, windows, drawn)

    def _drafting(self, streams) -> tuple:
        """(whether the round's decode windows may draft, whether the gate times it): without a gate every round may;
        with one, a decode round (no prompt chunk) that the gate says pays, every decode round timed."""
        if self.gate is None:
            return True, False
        if any(stream.prompt_fed < len(stream.request.prompt) for stream in streams):
            return False, False
        tokens = [stream.tokens_a_draft for stream in streams if stream.request.params.draft]
        return bool(tokens) and self.gate.drafts(len(streams), tokens), True

    def _recordings(self) -> int:
        """Recordings made so far, the engine's and the drafter's: a round that made one is not timed."""
        return (self.graphs.recorded if self.graphs is not None else 0) + self.drafter.recordings

    def _draws(self, streams, windows, logits, starts, planned=None) -> list:
        """For each stream, `draw(row)`: the model's token at a row of its window's logits (rows starts[s] ..
        starts[s + 1] - 1 of `logits`). The round's draws are one backend call and only the tokens come back: row r
        is drawn for output position len(output) + depth(r), its position if the walk reaches it. The streams
        `rows_to_draw` names draw on the host, a row at a time as the walk reaches it; a scored prompt chunk records
        its prompt's logprobs. `planned`: a replayed round's (host, batch, the tokens drawn in its recording)."""
        host, batch, tokens = planned if planned is not None else (*rows_to_draw(streams, windows), None)
        draws = [None] * len(streams)
        for s in host:
            request, p, stream = streams[s].request, streams[s].request.params, streams[s]
            rows = self.model.backend.to_host(logits[starts[s]:starts[s + 1]])
            if stream.prompt_fed < len(request.prompt):  # a prompt chunk, scored
                request.prompt_logprobs += prompt_log_probabilities(rows, request.prompt, stream.prompt_fed,
                                                                    p.prompt_logprobs)
            draws[s] = lambda row, request=request, rows=rows: self._sample(request, rows[row])
        if batch and tokens is None:
            backend = self.model.backend
            if len(batch) == len(streams):  # every stream's rows, in order: the round's logits as they are
                drawn = logits
            else:  # (a device array's slice costs host time: made only here)
                drawn = backend.concat_rows([logits[starts[s]:starts[s + 1]] for s, _, _ in batch])
            tokens = backend.sample_rows(drawn, *draw_parameters(batch))
        start = 0
        for s, positions, _ in batch:
            mine = [int(t) for t in tokens[start:start + len(positions)]]
            draws[s] = mine.__getitem__
            start += len(positions)
        return draws

    def _admit(self, request: Request) -> Stream:
        """A free lane for the request, its cache empty or resumed from the prompt cache's longest stored prefix."""
        lane = self._free_lane()
        n = self.lanes.index(lane)
        if request.params.draft:  # the lane's last drafter state, emptied in place: recordings on it replay
            self.drafts[n] = self.drafter.reset(self.drafts[n]) if n in self.drafts else self.drafter.new_stream()
        stream = Stream(request, lane, self.drafts[n] if request.params.draft else None)
        resumes = self.prompt_cache is not None and request.params.prompt_logprobs is None  # scoring runs every row
        snapshot = self.prompt_cache.lookup(request.prompt) if resumes else None
        if snapshot is not None:
            snapshot.restore(stream.state)
            stream.state.settle()  # the snapshot's arrays copied into the lane's own buffers
            if stream.draft_state is not None:
                stream.draft_state = self.drafter.restore(snapshot.draft, into=stream.draft_state)
            stream.prompt_fed = request.stats.cached_tokens = snapshot.length
        return stream

    def _free_lane(self):
        """The cache of the first lane no active stream holds, reset; a new one while there are fewer than
        `parallel`."""
        held = [stream.state for stream in self.active]
        for lane in self.lanes:
            if all(lane is not state for state in held):
                lane.reset()
                return lane
        pool = self.graphs.pool if self.graphs is not None else None  # recorded rounds scan the lanes' states together
        self.lanes.append(self.model.net.new_state(self.context, self.keep, pool, lane=len(self.lanes)))
        return self.lanes[-1]

    def _window(self, stream: Stream, drafting: bool = True) -> Window:
        """This round's rows for a stream: the next prompt chunk, or the decode row and (when `drafting`) its drafted
        chain or tree. When rounds replay from recordings, a drafted window is padded to `window_rows` (each padding
        row follows the row before it), so that a shorter proposal replays the round it recorded: a row's bits do not
        depend on the rows after it, and the walk and the keep never reach the padding."""
        request = stream.request
        if stream.prompt_fed < len(request.prompt):
            end = stream.prompt_fed + stream.prompt_rows
            if self.prompt_cache is not None:  # a chunk ends at a mark, where the cache stores the stream (`_after`)
                end = min([end] + [m for m in self.prompt_cache.marks(len(request.prompt)) if m > stream.prompt_fed])
            rows = request.prompt[stream.prompt_fed:end]
            scoring = request.params.prompt_logprobs is not None and len(rows) > 1  # (one row: its last)
            return Window(stream.state, rows, "all" if scoring else "last")
        room = min(request.params.max_tokens - len(request.output) - 1, self.max_draft)  # drafts past the end waste
        drafts, parents = self.drafter.propose_tree(stream.tokens, room, stream.draft_state) \
            if drafting and request.params.draft and room > 0 else ([], [])
        ids = [stream.next_token] + list(drafts)
        parents = [-1] + [p + 1 for p in parents]
        padding = 0
        if drafts and self.graphs is not None:  # one recorded shape, however many rows the drafter gave this time
            padding = max(0, min(self.window_rows, self.context - stream.state.length) - len(ids))
            ids, parents = ids + [ids[-1]] * padding, parents + list(range(len(ids) - 1, len(ids) - 1 + padding))
        if parents == list(range(-1, len(ids) - 1)):
            return Window(stream.state, ids, "all", padding=padding)  # a chain
        return Window(stream.state, ids, "all", parents=parents, padding=padding)

    def _after(self, stream: Stream, window: Window, draw, drafting: bool = False, observes: bool = True) -> None:
        """Keep the accepted rows and hand out the new tokens (`draw(row)`: the model's token at a row). `drafting`:
        the round let streams draft, so what it gave one that drafts (1 token if nothing was proposed) is counted.
        `observes`: the kept rows are shown to the drafter (behind a gate, `DraftGate.watching` says when)."""
        request = stream.request
        request.stats.rounds += 1
        if stream.prompt_fed < len(request.prompt):  # a prompt chunk
            self._observe(stream, window, range(len(window.ids)))
            stream.state.keep(len(window.ids), write_back=True)  # a prompt chunk lands pending rows
            stream.prompt_fed += len(window.ids)
            if self.prompt_cache is not None and stream.prompt_fed in self.prompt_cache.marks(len(request.prompt)):
                draft = self.drafter.save(stream.draft_state) if stream.draft_state is not None else None
                self.prompt_cache.store(request.prompt[:stream.prompt_fed], stream.state, draft)
            if stream.prompt_fed == len(request.prompt):
                self._emit(stream, draw(-1))  # the chunk's last row
            return
        drafts = window.ids[1:window.used]
        request.stats.drafted += len(drafts)
        emitted = len(request.output)
        if drafts:
            request.stats.draft_rounds += 1
        if window.parents is not None:
            self._walk_tree(stream, window, draw, observes)
        else:
            self._walk_chain(stream, window, draw, drafts, observes)
        if self.gate is not None and (drafts or (drafting and request.params.draft)):
            stream.tokens_a_draft, stream.drafts_measured = self.gate.tokens_after(
                stream.tokens_a_draft, len(request.output) - emitted, stream.drafts_measured)

    def _walk_chain(self, stream: Stream, window: Window, draw, drafts, observes: bool) -> None:
        """Verify a chain: accept the drafted tokens while they equal the model's own, then keep those rows (shown to
        the drafter when it `observes`)."""
        request = stream.request
        kept = 0
        for row in range(len(window.ids)):
            token = draw(row)
            kept = row + 1
            if not self._emit(stream, token) or row == len(drafts) or drafts[row] != token:
                break
            request.stats.accepted += 1
        if request.finish_reason is None:
            if observes:
                self._observe(stream, window, range(kept))
            if window.issued_at is None:  # (a round replayed ahead kept its row when it was issued)
                stream.state.keep(kept)

    def _walk_tree(self, stream: Stream, window: Window, draw, observes: bool) -> None:
        """Verify a tree: from the root, follow the child whose token equals the model's own token at that row; keep
        the path (shown to the drafter when it `observes`)."""
        request = stream.request
        children = [[] for _ in range(window.used)]
        for child, parent in enumerate(window.parents[1:window.used], 1):
            children[parent].append(child)
        path, row = [0], 0
        while True:
            token = draw(row)
            if not self._emit(stream, token):
                break
            row = next((c for c in children[row] if window.ids[c] == token), None)
            if row is None:
                break
            request.stats.accepted += 1
            path.append(row)
        if request.finish_reason is None:
            if observes:
                self._observe(stream, window, path)
            stream.state.keep_path(path)

    def _observe(self, stream: Stream, window: Window, rows) -> None:
        """Show the drafter the tapped layer outputs at the rows the stream is about to keep, in order."""
        if stream.draft_state is None or not window.features:
            return
        position = stream.state.length if window.issued_at is None else window.issued_at
        self.drafter.observe(stream.draft_state, window.features, position, kept=list(rows))

    def _sample(self, request: Request, logits_row) -> int:
        """The token for the request's next output position. The processing, the grammar's mask and the logprobs
        depend only on the settings and the tokens so far, which a drafted row and a one-row step share, so they keep
        drafted output equal to undrafted."""
        p = request.params
        logits_row = process_logits(logits_row, p, request.history)
        allowed = logits_row if request.matcher is None else request.matcher.mask(logits_row)
        token = self.model.backend.sample(allowed, request.seed, len(request.output), p.temperature, p.top_k,
                                          p.top_p, p.min_p)
        if request.matcher is not None:  # every draw is emitted next (or ends the request)
            request.matcher.advance(token)
        if p.logprobs is not None:
            request.logprobs.append(log_probabilities(logits_row, token, p.logprobs))
        return token

    def _emit(self, stream: Stream, token: int) -> bool:
        """Hand out one sampled token; False when the request has ended."""
        request = stream.request
        stops = self.model.tokenizer.stop_ids if request.params.stop_ids is None else request.params.stop_ids
        if token in stops:
            self._finish(stream, "stop")
            return False
        if request.first_token_at is None:
            request.first_token_at = time.perf_counter()
        request.output.append(token)
        request.history.add(token)
        request.stats.output_tokens += 1
        request._put(token)
        stream.next_token = token
        if len(request.output) >= request.params.max_tokens:
            self._finish(stream, "length")
            return False
        return True

    def _finish(self, stream: Stream, reason: str, error: Exception | None = None) -> None:
        with self._lock:
            if stream in self.active:
                self.active.remove(stream)
        if stream.request.finish_reason is None:  # once: a stream that fails after its end keeps that end
            stream.request.finish_reason, stream.request.error = reason, error
            stream.request._put(FINISHED)

    # --- the engine thread --------------------------------------------------------------------------------------

    def start(self) -> None:
        """Run rounds on a background thread until `stop`."""
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="tensorfold-engine", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            while self._running:
                with self._lock:
                    while self._running and not self.waiting and not self.active:
                        self._lock.wait()
                if self._running:
                    self.run_round()
        except BaseException as error:  # what a round could not isolate: end every request, refuse new ones
            self.failure = error
            with self._lock:
                self._running, ended, self.waiting = False, self.active + [Stream(r, None) for r in self.waiting], []
            for stream in ended:
                self._finish(stream, "error", error)
            raise

    def stop(self, cancel: bool = True) -> None:
        """Stop the thread; with `cancel`, end every waiting and active request as cancelled first."""
        with self._lock:
            if cancel:
                for request in self.waiting:
                    self._finish(Stream(request, None), "cancelled")
                self.waiting.clear()
                for stream in self.active:
                    stream.request.cancel()
            self._running = False
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        for stream in list(self.active):
            self._finish(stream, "cancelled")

    @property
    def queue_depth(self) -> int:
        return sum(not request.cancelled for request in self.waiting)  # a cancelled one leaves when admitted

    def stream_bytes(self) -> int:
        """Memory one lane's cache takes when it holds `context` rows (DeltaNet states, conv tails, the pending
        buffer, keys and values, the drafter's state); a window's scan log adds a few rows' worth while it waits to
        be kept. A lane keeps its buffers from request to request, never past `context` rows."""
        c = self.model.config
        linear = c.layer_types.count("linear_attention")
        full = len(c.layer_types) - linear
        per_linear = 4 * (c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim
                          + (c.linear_conv_kernel_dim - 1) * c.conv_dim)
        per_full = 4 * 2 * self.context * c.num_key_value_heads * c.head_dim
        pending = self.keep.capacity * pending_row_bytes(c) if self.keep.late else 0  # the deferred keep's buffer
        return linear * per_linear + full * per_full + pending + self.drafter.stream_bytes(self.context)
