"""The prompt cache: stream states kept at marks inside prompts, so that a repeated prompt, or the next turn of a
chat, resumes instead of starting over.

A mark is a prompt position at a multiple of `granularity` rows; what is kept there is the stream's whole cache at
that point (each DeltaNet layer's state and conv tail, each attention layer's key and value rows), copied to host
memory and keyed by the sha256 of the token prefix. Marks of a prompt of n tokens: the last multiple of
`granularity` before n (so the same prompt, or any prompt that extends it, resumes there) and every `spacing`
tokens before that (so a long prompt that changes near its end still resumes most of the way). The engine ends a
prompt chunk at each mark it passes (`Engine._window`), so its chunks may be longer than `granularity`: each mark
inside a chunk costs the prompt one round more. The store holds at most `budget` bytes and evicts the least
recently used states first.

A mark's memory, in float32, is a fixed part (every DeltaNet layer's state and conv tail) plus a part that grows
with the prompt (every attention layer's key and value rows); docs/history/serving.rst works it out for the
released sizes.

Resuming gives the same bits as a fresh pass: the states are copies, and every row's arithmetic is the same
whichever chunk it runs in.
"""
import collections
import hashlib
import threading

import numpy as np

from tensorfold.model.cache import StreamState


def prefix_key(tokens) -> str:
    return hashlib.sha256(np.asarray(tokens, "<i4").tobytes()).hexdigest()


class Snapshot:
    """A stream's cache at `length` rows, in host memory, with its drafter's state when the drafter keeps one
    (`draft`, what `Drafter.save` returned)."""

    def __init__(self, state: StreamState, draft=None):
        state.land()  # the deferred keep's pending rows go into the state before it is copied
        ops = state.ops
        self.length = state.length
        self.recurrent = {i: ops.to_host(a).copy() for i, a in state.recurrent.items()}
        self.conv_tail = {i: ops.to_host(a).copy() for i, a in state.conv_tail.items()}
        self.keys = {i: ops.to_host(a[:state.length]).copy() for i, a in state.keys.items()}
        self.values = {i: ops.to_host(a[:state.length]).copy() for i, a in state.values.items()}
        self.draft = draft
        parts = [*self.recurrent.values(), *self.conv_tail.values(), *self.keys.values(), *self.values.values()]
        self.nbytes = sum(a.nbytes for a in parts) + (draft.nbytes if draft is not None else 0)

    def restore(self, state: StreamState) -> None:
        """Make `state` this snapshot (rows it had pending are dropped with the rest of it)."""
        upload = state.ops.upload
        state.length, state.pending_rows, state.pending = self.length, 0, {}
        for i in state.recurrent:
            state.recurrent[i], state.conv_tail[i] = upload(self.recurrent[i].copy()), upload(self.conv_tail[i].copy())
        for i in state.keys:
            state.keys[i], state.values[i] = upload(self.keys[i].copy()), upload(self.values[i].copy())


class PromptCache:
    """Snapshots at prompt marks, keyed by prefix, under a byte budget with LRU eviction."""

    def __init__(self, budget_bytes: int, granularity: int = 128, spacing: int = 2048):
        if granularity < 1:
            raise ValueError(f"a prompt cache's granularity must be positive, not {granularity}")
        self.budget, self.granularity = budget_bytes, granularity
        self.spacing = max(granularity, spacing // granularity * granularity)  # marks sit on multiples of it
        self.entries: collections.OrderedDict = collections.OrderedDict()  # key -> Snapshot, oldest first
        self.lengths: collections.Counter = collections.Counter()  # stored prefix lengths
        self.bytes = 0
        self.hits = 0
        self._lock = threading.Lock()

    def marks(self, prompt_length: int) -> set:
        """Where a prompt of this length leaves snapshots."""
        last = (prompt_length - 1) // self.granularity * self.granularity
        return ({last} | set(range(self.spacing, last, self.spacing))) - {0} if last > 0 else set()

    def lookup(self, prompt) -> Snapshot | None:
        """The snapshot of the longest stored prefix shorter than the prompt (one token must still run)."""
        with self._lock:
            for length in sorted(self.lengths, reverse=True):
                if length < len(prompt):
                    key = prefix_key(prompt[:length])
                    if key in self.entries:
                        self.entries.move_to_end(key)
                        self.hits += 1
                        return self.entries[key]
        return None

    def store(self, prefix, state: StreamState, draft=None) -> None:
        key = prefix_key(prefix)
        with self._lock:
            if key in self.entries:
                self.entries.move_to_end(key)
                return
        snapshot = Snapshot(state, draft)
        with self._lock:
            if snapshot.nbytes > self.budget or key in self.entries:
                return
            while self.bytes + snapshot.nbytes > self.budget:
                _, old = self.entries.popitem(last=False)
                self.bytes -= old.nbytes
                self.lengths[old.length] -= 1
                if not self.lengths[old.length]:
                    del self.lengths[old.length]
            self.entries[key] = snapshot
            self.lengths[snapshot.length] += 1
            self.bytes += snapshot.nbytes
