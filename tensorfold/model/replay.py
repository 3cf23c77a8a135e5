"""Decode rounds as CUDA graphs: the round recorded once per set of streams, then replayed by one driver call.

A *decode round* is one in which every stream's window is its one decode row: no prompt chunk, no drafted row. With
the same streams, two decode rounds launch the same kernels on the same buffers; only a few integers differ (each
row's token id, position, key count and cache row), and the work after the forward is always the same keep of
one row. `DecodeGraphs.run(windows)` runs such a round, forward and keep, from a recording
(tensorfold/device/graphs.py):

1. Each stream lands its pending DeltaNet rows, puts its state and conv tail back in its own buffers (`settle`),
   and grows its key/value buffers when the next row would not fit, by HEADROOM rows at least: eager work, done
   before recording or replaying, and rarely needed.
2. The recording for these streams' buffers is looked up, or made: `forward_logits` over `RoundInputs` that read a
   fixed [4, rows] buffer (`recorded`: the attention covers each stream's whole cache, so its grid does not
   depend on the lengths), in which the scan and the conv write each stream's new DeltaNet state and conv tail
   over the stored ones (`in_place`), then each stream's `commit_in_place` (which copies whatever was not
   written in place). The keys and values are already in place: `kv_write` puts them at the cache row
   the buffer says.
3. The round's integers are written into the recording's pinned host buffer (`CudaBackend.mapped`: a store, no
   driver call), the graph is replayed, its first kernel copies them into the fixed buffer, and each stream's
   `keep(1)` then only counts the row (`kept_on_device`).

The logits are the graph's own output buffer, one row for each stream in order, which the engine's sampling reads
as it is: read them before the next round. A recording is keyed by the identity of its streams' cache buffers, in
order (`StreamState.settled_buffers`: once settled, a stream's own DeltaNet states and conv tails never change, so
the first stands for them all, and then its key/value buffers); the graph keeps those buffers alive (it holds
every argument it launched), so no other array can take one of those identities while the key is in the cache. A
stream joining or leaving, or a grown buffer, makes a new key and a new recording; at most `capacity` are kept,
the least recently used dropped first.

Every replay computes the bits the eager round computes: the same kernels, in the same order, on the same values
(tests/test_graphs.py checks tokens and logits bytes with graphs on and off).
"""
import collections
import dataclasses
import os

import numpy as np

from tensorfold.device import graphs
from tensorfold.model.rows import RoundInputs

HEADROOM = 256  # key/value rows a buffer grows by at least before a recording: one new recording per 256 rounds


def replays_decode_rounds(backend, graphs: bool | None = None) -> bool:
    """Whether an engine on `backend` replays its decode rounds from CUDA graphs: on a backend that can record them,
    unless `graphs` is False, or None with TENSORFOLD_GRAPHS=0 in the environment."""
    if graphs is None:
        graphs = os.environ.get("TENSORFOLD_GRAPHS", "1") != "0"
    return graphs and backend.can_record


@dataclasses.dataclass
class Recorded:
    graph: object  # tensorfold.device.graphs.Graph
    integers: object  # the round's [4, rows] int32 in pinned host memory, copied to the device by its first kernel
    logits: object  # the graph's output buffer: the logits [streams, vocab], a row for each window in order
    starts: list  # where each window's row starts in it, and the end (as Qwen35.forward_logits gives them)


class DecodeGraphs:
    """Recorded decode rounds of one model (on a backend that `can_record`), keyed by their streams' cache buffers."""

    def __init__(self, net, capacity: int = 4):
        self.net, self.capacity = net, capacity
        self.recordings = collections.OrderedDict()  # key -> Recorded, least recently used first
        self.recorded = self.replayed = 0  # counts, for tests and the benchmark

    @staticmethod
    def eligible(windows, taps=()) -> bool:
        """Whether a round is a decode round a graph can run: one chain row per stream, logits for it, no taps
        (a block drafter keeps the tapped features, which a replay would overwrite)."""
        return not taps and all(len(w.ids) == 1 and w.parents is None and w.logits_for == "all" for w in windows)

    def run(self, windows: list) -> tuple:
        """Forward and keep a decode round from its recording; returns the round's logits and where each window's
        row starts, as `Qwen35.forward_logits` does. Each stream's `keep(1)` afterwards only counts the row."""
        assert self.eligible(windows), "a graph runs decode rounds only"
        for win in windows:
            state = win.state
            state.land()
            state.settle()
            if any(buffer.shape[0] <= state.length for buffer in state.keys.values()):
                room = HEADROOM if state.max_rows is None else min(HEADROOM, state.max_rows - state.length)
                state.reserve(room)
        key = tuple(id(buffer) for win in windows for buffer in win.state.settled_buffers())
        recorded = self.recordings.get(key)
        if recorded is None:
            recorded = self.recordings[key] = self._record(windows)
            while len(self.recordings) > self.capacity:
                self.recordings.popitem(last=False)
        self.recordings.move_to_end(key)
        self.write_integers(recorded, windows)
        recorded.graph.replay()
        self.replayed += 1
        for win in windows:
            win.state.window_rows, win.state.kept_on_device = 1, True
        return recorded.logits, recorded.starts

    def write_integers(self, recorded: Recorded, windows: list) -> None:
        """The round's integers into the recording's host buffer, once its last replay has copied them out (in the
        engine it has: that round's tokens came back, so the wait returns at once)."""
        self.net.ops.synchronize()
        recorded.integers[...] = RoundInputs.table(windows)

    def _record(self, windows: list) -> Recorded:
        """Record the forward and the in-place keep of a decode round over a fixed input buffer."""
        ops = self.net.ops
        integers, readable = ops.mapped((4, len(windows)), np.int32)
        table = ops.upload(np.zeros((4, len(windows)), np.int32))
        inputs = RoundInputs.on(ops, table, recorded=True)
        for win in windows:
            win.maps  # a one-row chain's maps, uploaded before the recording (an upload cannot be recorded)
        try:
            with graphs.Recording(ops.stream) as recording:
                ops.copy_into(table, readable)  # the kernels after it read device memory, not the host's, each time
                logits, starts = self.net.forward_logits(windows, inputs=inputs)
                with ops.side_by_side(len(windows)) as lanes:
                    for n, win in enumerate(windows):
                        with lanes.lane(n):
                            win.state.commit_in_place()
        finally:  # nothing has run yet: the streams are as they were
            for win in windows:
                win.state.records, win.state.window_rows = {}, 0
        self.recorded += 1
        return Recorded(recording.graph, integers, logits, starts)
