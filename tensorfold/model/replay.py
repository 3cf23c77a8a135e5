"""Decode rounds as CUDA graphs: each shape of round recorded once per set of streams, then replayed by one driver
call.

A *decode round* is one in which every stream's window is its decode row, alone or followed by drafted rows: a
chain or a tree of up to MAX_ROWS rows in all, with logits for every row (a prompt chunk, which comes once per prompt
in up to `chunk` rows, runs eagerly). Two decode rounds of the same streams with the same window shapes launch the
same kernels on the same buffers; only a few integers differ (each row's token id, position, key count, cache row
and its stream's length). `DecodeGraphs.run(windows)` runs such a round's forward from a recording
(tensorfold/device/graphs.py):

1. Each stream lands the DeltaNet rows an eager round left pending, puts its state and conv tail back in its own
   buffers (`settle`), and grows its key/value buffers when the window's rows would not fit, by HEADROOM rows at
   least (a buffer that grows at least doubles, `reserve_rows`: a stream of n rows grows them about
   log2(n / HEADROOM) times, each a new recording): eager work, done before recording or replaying, and nothing at
   all after a replayed round.
2. The recording for these streams' buffers and window shapes is looked up, or made: `forward_logits` over
   `RoundInputs` that read a fixed [RoundInputs.ROWS, rows] buffer (`recorded`: the attention covers each stream's
   whole cache, so its grid does not depend on the lengths), each tree's rows over index maps in a fixed buffer
   whose size its rows alone set (`RowMaps.padded`: path_slots padded to [rows, rows], padding no kernel reads),
   and each chain's over the maps of its length. The keys and values go in place: `kv_write` puts them at the cache
   rows the buffer says.
3. The round's integers and its trees' maps are written into the recording's pinned host buffers
   (`CudaBackend.mapped`: a store, no driver call), the graph is replayed, and its first kernels copy them into the
   fixed buffers.
4. When every stream of the round draws on the device (no request's logits processed on the host, masked by a
   grammar or reported as logprobs), the draws are recorded after the forward too: their per-row parameters go
   into mapped memory before the replay as the integers do, and the tokens come back through mapped memory, so a
   round is one replay and one wait. (Such rounds and the others are recorded apart: the key says which.) A
   one-row round drawn so also copies its tokens into a device buffer of its key (`feeds`), and the next round of
   the same key may be replayed ahead (`follows`, `run(..., ahead=True)`): its recording copies its ids from that
   buffer, so the host issues it before it has read the tokens (engine.py, "Rounds replayed ahead"). Two
   recordings of such a round take turns, and a replay waits only for its own recording's last replay (an event
   recorded after each, `Graph.wait`) before it rewrites that recording's pinned buffers.

What the keep then does depends on the shape.

* A one-row round (every window one row, the round undrafted decoding runs) keeps its row in the graph: the scan
  and the conv write each stream's new DeltaNet state and conv tail over the stored ones (`in_place`), then each
  stream's `commit_in_place` copies whatever was not written in place, and `keep(1)` only counts the row
  (`kept_on_device`).
* A drafted round keeps its rows through a second recording, its *keep*: the scan and the conv leave the stored
  state and tail as they were and write the window's DeltaNet records (the scan's log, the conv inputs) into
  buffers the graph owns. After its walk each stream's `keep(n)` or `keep_path(path)` writes the kept path, padded
  with -1, and its length into the keep's pinned buffer (`StreamState.keep_row`), and `keep_round` replays the keep
  once for the whole round: per stream, `deltanet_apply` replays the path's logged rows into each DeltaNet state,
  `conv_tail_after` moves each conv tail along the path, and a tree's `kv_compact` moves its kept key/value rows
  down to length + depth, all in place in the stream's own buffers, each kernel reading the path from device
  memory. A stream whose request ended keeps nothing: its path stays empty.

So every kept row is in the stream's own buffers before the next replay overwrites the graph's. An eager round (a
prompt chunk in the round, or graphs off) keeps as `StreamState` does: its pending rows and any state or tail it
pointed elsewhere are landed and copied home (`settle`) by step 1 before a replay. The logits (one row per window
row, in order) and a block drafter's tapped features are the graph's output buffers too, which the engine reads
within the round: the sampling reads the logits, and the drafter's `observe` projects the features into its own
context before the round ends.

A recording is keyed by the identity of its streams' cache buffers, in order (`StreamState.settled_buffers`: once
settled, a stream's own DeltaNet states and conv tails never change, so the first stands for them all, and then its
key/value buffers), by each window's rows and whether they are a chain or a tree, and by the taps; the graph keeps
those buffers alive (it holds every argument it launched), so no other array can take one of those identities while
the key is in the cache. A tree's parents are not in the key: its maps are round data, so a tree of n rows replays
one recording whatever its shape. The engine's lanes (engine.py) keep their caches from request to request, reset
in place, and list their streams in lane order, so a lane's next request replays the recordings made on its buffers.
A stream joining or leaving, a grown buffer (a lane keeps it) or a new window shape makes a new key and a new
recording.

A recording holds every array its round made: the activations of its rows, the logits [rows, vocab], the attention
partials (rows x heads x the cache's chunks x head_dim, per attention layer), and per DeltaNet layer and window a
state, a log and a conv tail. So its memory grows with the round's rows, the streams and the cache; at most
`capacity` are kept, the least recently used dropped first (a smaller `capacity` bounds the memory, a larger one
records less often when window shapes vary). With every lane busy a round's key varies only in its windows' rows
and kinds; the subsets of lanes that a filling or draining engine runs are passing keys, which the LRU drops.

Every replay computes the bits the eager round computes: the same kernels, in the same order, on the same values
(tests/test_graphs.py checks tokens and logits bytes with graphs on and off; tests/test_replay_reuse.py a lane's
next request against a fresh stream, and trees of another shape against eager rounds).
"""
import collections
import dataclasses
import os

import numpy as np

from tensorfold.device import graphs
from tensorfold.model.rows import RoundInputs, RowMaps

HEADROOM = 256  # key/value rows a buffer grows by at least before a recording
MAX_ROWS = 16  # a window's rows in a replayed round: the decode row and up to 15 drafted rows (the engine's max_draft)


def replays_decode_rounds(backend, graphs: bool | None = None) -> bool:
    """Whether an engine on `backend` replays its decode rounds from CUDA graphs: on a backend that can record them,
    unless `graphs` is False, or None with TENSORFOLD_GRAPHS=0 in the environment."""
    if graphs is None:
        graphs = os.environ.get("TENSORFOLD_GRAPHS", "1") != "0"
    return graphs and backend.can_record


@dataclasses.dataclass
class Recorded:
    graph: object  # tensorfold.device.graphs.Graph
    integers: object  # the round's [RoundInputs.ROWS, rows] int32 in pinned host memory, copied in by its first kernel
    maps: object  # its trees' maps (`tree_maps`) in pinned host memory, copied in by its second kernel; or None
    logits: object  # the graph's output buffer: the logits [rows, vocab], every window's rows in order
    starts: list  # where each window's rows start in it, and the end (as Qwen35.forward_logits gives them)
    in_place: bool  # a one-row round, kept in the graph; else a drafted round, kept by `keep`
    features: list  # per window, its tapped features (graph buffers), or None without taps
    keep: object = None  # a drafted round's recorded keep (a Graph), replayed by `keep_round`
    paths: object = None  # its pinned host [windows, 1 + MAX_ROWS]: each stream's length, then its kept path, -1s
    draws: object = None  # the draws recorded after the forward: their parameters and tokens in mapped memory


class DecodeGraphs:
    """Recorded decode rounds of one model (on a backend that `can_record`), keyed by their streams' cache buffers
    and window shapes."""

    def __init__(self, net, capacity: int = 16, lanes: int = 0):
        self.net, self.capacity = net, capacity
        self.pool = net.lane_pool(lanes) if lanes else None  # the DeltaNet states of an engine's `lanes` lanes
        self.recordings = collections.OrderedDict()  # key -> Recorded, least recently used first
        self.recorded = self.replayed = 0  # counts, for tests and the benchmark
        self.kernels = 0  # kernel launches of the round replayed last (its forward, and its draws if recorded with it)
        self.keeping = None  # the drafted round replayed last, whose keep `keep_round` replays
        self.feeds = {}  # key of a one-row round drawn in its replay -> the device copy of the tokens it drew
        self.fed = None  # the key of the round replayed last, when it fed its tokens (a round may follow it ahead)
        self.variant = 0  # which of the two recordings of a round that follows ahead replays next

    @staticmethod
    def eligible(windows) -> bool:
        """Whether a round is a decode round a graph can run: every window 1 .. MAX_ROWS rows, logits for all."""
        return all(1 <= len(w.ids) <= MAX_ROWS and w.logits_for == "all" for w in windows)

    def run(self, windows: list, taps: tuple = (), draws: tuple | None = None, ahead: bool = False) -> tuple:
        """Forward a decode round from its recording; returns the round's logits, where each window's rows start (as
        `Qwen35.forward_logits` does) and its `Drawn` tokens, or None. With `draws`, every row's draw parameters
        (`sample_rows`' seeds, positions, temperature, top_k, top_p, min_p, in row order), the round's draws are
        part of its recording, and `Drawn.tokens()` waits for the replay and reads them. With `ahead` (a one-row
        round that `follows` the last), its ids are the tokens that round drew, read on the device: the host
        issues it before it has those tokens. A one-row round's `keep(1)` afterwards only counts the row; a
        drafted round's `keep` or `keep_path` writes its path for the round's recorded keep, which `keep_round`
        replays."""
        assert self.eligible(windows), "a graph runs decode rounds only"
        self.keeping = None
        for win in windows:
            state = win.state
            state.land()  # rows an eager round left pending: a recording scans from the stored state
            state.settle()  # and so is a state or tail an eager keep pointed at a forward's output
            if any(buffer.shape[0] < state.length + len(win.ids) for buffer in state.keys.values()):
                room = max(HEADROOM, len(win.ids))
                state.reserve(room if state.max_rows is None else min(room, state.max_rows - state.length))
        base = self.key(windows, taps)
        feeding = draws is not None and all(len(win.ids) == 1 for win in windows)
        if feeding and base not in self.feeds:
            self.feeds[base] = self.net.ops.upload(np.zeros(len(windows), np.int32))
        assert not ahead or self.fed == base, "a round replayed ahead follows a fed round of the same key"
        if ahead:
            self.variant ^= 1  # two recordings in turn: one's buffers are rewritten while the other's round runs
        key = base + (draws is not None, self.variant if ahead else None)
        recorded = self.recordings.get(key)
        if recorded is None:
            recorded = self.recordings[key] = self._record(windows, taps, draws is not None,
                                                           self.feeds.get(base) if feeding else None, ahead)
            while len(self.recordings) > self.capacity:
                dropped, _ = self.recordings.popitem(last=False)
                if all(other[:3] != dropped[:3] for other in self.recordings):
                    self.feeds.pop(dropped[:3], None)
        self.recordings.move_to_end(key)
        self.write_integers(recorded, windows)
        if draws is not None:
            recorded.draws.write(*draws)
        recorded.graph.replay()
        self.fed = base if feeding else None
        self.replayed, self.kernels = self.replayed + 1, recorded.graph.kernels
        for n, (win, features) in enumerate(zip(windows, recorded.features)):
            win.features = features
            if recorded.in_place:
                win.state.window_rows, win.state.kept_on_device = 1, True
            else:  # the keep writes its path into the recorded keep's buffer, and `keep_round` replays it
                win.state.window_rows, win.state.keep_row = len(win.ids), recorded.paths[n]
        if not recorded.in_place:
            self.keeping = (recorded, windows)
        return recorded.logits, recorded.starts, None if draws is None else Drawn(recorded)

    def follows(self, windows: list, taps: tuple = ()) -> bool:
        """Whether a one-row round can be replayed ahead (`run(..., ahead=True)`), its ids the tokens the last round
        drew: that round fed its tokens, with the same streams, buffers and taps, and every stream's key/value
        buffers have room for its row (a buffer that must grow makes another recording)."""
        return (self.fed is not None and all(len(win.ids) == 1 and win.parents is None for win in windows)
                and self.key(windows, taps) == self.fed
                and all(buffer.shape[0] > win.state.length for win in windows for buffer in win.state.keys.values()))

    def keep_round(self) -> None:
        """After the walks of a drafted round: replay its recorded keep, which applies every stream's kept path (the
        DeltaNet states, the conv tails and a tree's key/value rows, in place); a stream that kept nothing (its
        request ended) left its path empty."""
        if self.keeping is None:
            return
        recorded, windows = self.keeping
        self.keeping = None
        recorded.keep.replay()
        for win in windows:
            win.state.keep_row = None

    @staticmethod
    def key(windows: list, taps: tuple) -> tuple:
        """A recording's key: its streams' settled buffers, each window's rows and whether they are a chain or a tree
        (a tree's maps are the round's data), and the taps."""
        return (tuple(id(buffer) for win in windows for buffer in win.state.settled_buffers()),
                tuple((len(win.ids), "chain" if win.parents is None else "tree") for win in windows), taps)

    def write_integers(self, recorded: Recorded, windows: list) -> None:
        """The round's integers and its trees' maps into the recording's host buffers, once its last replay (and its
        keep's) has copied them out: a wait for that replay alone, so that a round replayed ahead, on the other
        recording, runs on."""
        recorded.graph.wait()
        if recorded.keep is not None:
            recorded.keep.wait()
        recorded.integers[...] = RoundInputs.table(windows)
        if recorded.maps is not None:
            recorded.maps[...] = tree_maps(windows)
        if recorded.paths is not None:
            recorded.paths[...] = -1  # no path kept yet

    def _record(self, windows: list, taps: tuple, drawn: bool, feed=None, ahead: bool = False) -> Recorded:
        """Record the forward of a decode round over a fixed input buffer, its draws when `drawn` (and a copy of the
        tokens into `feed`, when given), and a one-row round's in-place keep; a drafted round's keep is a recording
        of its own (`_record_keep`). `ahead`: the ids come from `feed`, where the round before put its tokens."""
        ops = self.net.ops
        draws = ops.draw_slots(sum(len(win.ids) for win in windows)) if drawn else None
        shape = (RoundInputs.ROWS, sum(len(win.ids) for win in windows))
        integers, readable = ops.mapped(shape, np.int32)
        table = ops.upload(np.zeros(shape, np.int32))
        in_place = all(len(win.ids) == 1 for win in windows)
        pooled = in_place and self.pool is not None and all(win.state.pool is self.pool for win in windows)
        lanes = ops.upload(np.array([win.state.lane for win in windows], np.int32)) if pooled else None
        inputs = RoundInputs.on(ops, table, recorded=True, in_place=in_place, lanes=lanes)
        trees = [win for win in windows if win.parents is not None]
        maps = None
        if trees:  # a tree reads its maps from a buffer each replay rewrites, as it does the integers
            width = self.net.config.linear_conv_kernel_dim
            maps, readable_maps = ops.mapped(tree_maps(windows).shape, np.int32)
            device_maps, start = ops.upload(np.zeros(maps.shape, np.int32)), 0
            for win in trees:
                size = RowMaps.padded_size(len(win.ids), width)
                win.maps = RowMaps.over(device_maps[start:start + size], len(win.ids), width)
                start += size
        for win in windows:
            win.maps  # a chain's uploaded before the recording (an upload cannot be recorded); the graph holds them
        try:
            with graphs.Recording(ops.stream) as recording:
                ops.copy_into(table, readable)  # the kernels after it read device memory, not the host's, each time
                if ahead:
                    ops.copy_into(table[0], feed)  # the ids: the tokens the round before drew
                if trees:
                    ops.copy_into(device_maps, readable_maps)
                logits, starts = self.net.forward_logits(windows, taps, inputs)
                if drawn:
                    ops.draw_into(logits, draws)
                if feed is not None:
                    ops.copy_into(feed, draws.device_tokens)
                if in_place:
                    with ops.side_by_side(len(windows)) as lanes:
                        for n, win in enumerate(windows):
                            with lanes.lane(n):
                                win.state.commit_in_place()
            records = [win.state.records for win in windows]
            features = [win.features for win in windows]
        finally:  # nothing has run yet: the streams are as they were
            for win in windows:
                win.state.records, win.state.window_rows = {}, 0
        self.recorded += 1
        keep, paths = (None, None) if in_place else self._record_keep(windows, records)
        return Recorded(recording.graph, integers, maps, logits, starts, in_place, features, keep, paths, draws)

    def _record_keep(self, windows: list, records: list) -> tuple:
        """Record a drafted round's keep over its records: per stream, its DeltaNet states replay the kept path's
        rows of the scan's log, its conv tails move along the path, and a tree's kept key/value rows move down to
        length + depth, all in the stream's own buffers, reading the path (and the length) from a buffer that each
        round rewrites. Returns (graph, the buffer's pinned host view)."""
        ops = self.net.ops
        paths, readable = ops.mapped((len(windows), 1 + MAX_ROWS), np.int32)
        table = ops.upload(np.zeros(paths.shape, np.int32))
        with graphs.Recording(ops.stream) as recording:
            ops.copy_into(table, readable)
            for n, (win, window_records) in enumerate(zip(windows, records)):
                committed, path = table[n, :1], table[n, 1:1 + len(win.ids)]
                for i, record in window_records.items():
                    state, tail = win.state.home[i]
                    assert record.before is state, "a recorded round scans from the stream's own state"
                    ops.deltanet_apply(state, record.log, path, in_place=True)
                    ops.conv_tail_after(tail, record.inputs, path)
                if win.parents is not None:
                    for i in win.state.keys:
                        ops.kv_compact(win.state.keys[i], win.state.values[i], committed, path)
        return recording.graph, paths


class Drawn:
    """The tokens a replayed round drew, in mapped memory: `tokens()` waits for that replay alone and reads them."""

    def __init__(self, recorded: Recorded):
        self.recorded = recorded

    def tokens(self) -> np.ndarray:
        self.recorded.graph.wait()
        return self.recorded.draws.tokens()


def tree_maps(windows: list) -> np.ndarray:
    """The round's trees' index maps on the host, window after window (`RowMaps.padded`: a size set by the rows)."""
    return np.concatenate([np.zeros(0, np.int32)] + [win.padded_maps for win in windows if win.parents is not None])
