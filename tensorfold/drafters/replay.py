"""The block drafter's per-round work as CUDA graphs: each proposal and each extend recorded once, then replayed by
one driver call (tensorfold/device/graphs.py; the target's decode rounds replay the same way, model/replay.py).

A drafted round asks the drafter for a block (`BlockDrafter.propose_tree`) and, after the walk, shows it the rows
the stream kept (`observe`). Eagerly each is a few dozen launches whose host time far exceeds their GPU time. Two
rounds of one stream launch the same kernels on the same buffers, and only a few integers differ, so:

* A proposal (`DraftGraphs.propose`): `DFlashModel.block` over the block's integers (block_table: ids, positions,
  key counts, the cache rows its keys and values go to) and the top-k of its logits. Rope reads the positions from
  device memory, `kv_write` writes the block's keys and values at the rows the table says, and attention reads its
  key counts there, its partials holding chunks for the whole buffer (`max_keys`), so its grid does not depend on
  the context's length. After the replay only the top-k ids and log-probabilities come to the host.
* An extend (`DraftGraphs.extend`): the features are copied into fixed staging buffers of `block_size` rows (a
  round keeps at most a block's rows; a window's arrays are copied whole, so neither a chain's kept rows nor a
  tree's path needs a slice or a gather), and `DFlashModel.write_context` runs over all of them. Its table
  (extend_table) sends the kept rows, in order, to the context's end and every other row (rejected or stale staging
  rows) past them, where the next block or extend overwrites them. Each row's keys and values depend on its own
  features and position alone, so the kept rows get the bits an eager extend of them alone gives. Only the kept rows
  are committed (`DraftContext.commit`). Features of more rows (a long prompt chunk) are extended eagerly.

In both, the round's integers are written into the recording's pinned host buffer (`CudaBackend.mapped`: a store,
no driver call) and the graph's first kernel copies them into a fixed device table that every later kernel reads.

A recording is keyed by the identity of its context's buffers (`DraftContext.buffers`, which keep it until they
fill up and double: HEADROOM rows at first) and, for a proposal, by the block's rows and k; the graph holds every
array it launched, so no other array can take one of those identities while the key is cached. A stream gets a new
recording when its buffers grow, when a new stream comes, and for each block height a proposal asks for (fewer rows
near a request's end). At most `capacity` recordings are kept, the least recently used dropped first: each holds
its block's activations, its logits [rows - 1, V] and its attention partials, and keeps its context's buffers
alive until it is dropped, so a smaller `capacity` bounds that memory, a larger one records less often with many
streams. Each stream's context needs RECORDINGS_A_CONTEXT at once (its proposal and its extend, every round), so
the capacity grows with the contexts made (`fit`): the streams of a round touch their recordings in turn, and
with fewer places than that, least-recently-used would drop each recording just before its next use and every
proposal and extend would record anew.

Every replay computes the bits the eager path computes: the same kernels in the same order on the same values
(the eager path uploads the same tables; tests/test_draft_replay.py checks ids, log-probabilities and keys bytes).
"""
import collections
import dataclasses

import numpy as np

from tensorfold.device import graphs


@dataclasses.dataclass
class Recorded:
    graph: object  # tensorfold.device.graphs.Graph
    integers: object  # the table in pinned host memory, copied into the device's by the graph's first kernel
    outputs: tuple  # a proposal's (ids, log-probabilities) [rows - 1, k] on the device; () for an extend



def block_table(length: int, root_id: int, mask_id: int, rows: int, start: int) -> np.ndarray:
    """A block's integers, int32 [4, rows]: its ids (the root, then masks), its positions (start on), each row's key
    count (the context's `length` keys and the whole block's) and the cache rows its keys and values go to (right
    after the context)."""
    slots = np.arange(rows)
    return np.array([[root_id] + [mask_id] * (rows - 1), start + slots, np.full(rows, length + rows),
                     length + slots], np.int32)


def extend_table(length: int, position: int, kept: list, given: int) -> np.ndarray:
    """Integers of an extend over `given` feature rows of which `kept` are committed, in that order (a chain's first
    rows, or a tree's path), int32 [2, given]: each row's position and the cache row its keys and values go to. The
    j-th kept row goes to position + j at the context's end (`length`) + j; the other rows go after them, past the
    end, where the next block or extend overwrites them: every row has a cache row of its own, so no two writes meet.
    """
    kept, chosen = list(kept), set(kept)
    rest = [row for row in range(given) if row not in chosen]
    table = np.empty((2, given), np.int32)
    table[:, kept + rest] = position + np.arange(given), length + np.arange(given)
    return table


RECORDINGS_A_CONTEXT = 2  # a stream's proposal and its extend


class DraftGraphs:
    """Recorded proposals and extends of one drafter (on a backend that `can_record`), keyed by their contexts'
    buffers; at most `capacity`, the least recently used dropped first."""

    def __init__(self, model, capacity: int = 16):
        self.model, self.ops, self.capacity = model, model.ops, capacity
        c = model.config
        self.recordings = collections.OrderedDict()  # key -> Recorded, least recently used first
        self.recorded = self.replayed = 0  # counts, for tests
        self.staging = [self.ops.zeros((c.block_size, c.hidden_size)) for _ in range(c.num_taps)]
        self.staged_rows = {}  # rows -> the staging buffers' first rows, sliced once (a slice costs the host)
        # rope's frequencies are uploaded on first use, which a recording refuses: one eager rope uploads them now
        self.ops.rope(self.ops.zeros((1, 1, c.head_dim)), [0], c.head_dim, c.rope_theta)

    def fit(self, contexts: int) -> None:
        """Room for the recordings of `contexts` streams' contexts used together (never less than before)."""
        self.capacity = max(self.capacity, RECORDINGS_A_CONTEXT * contexts)

    def propose(self, context, root_id: int, rows: int, start: int, k: int) -> tuple:
        """ops.topk(model.block_logits(context, root_id, rows, start), k), from its recording: host (ids, logprobs)."""
        assert rows >= 2 and start >= context.next_position, f"a block of {rows} rows at {start}"
        self.model.reserve(context, rows)
        key = ("propose", tuple(id(b) for b in context.buffers()), rows, k)
        recorded = self._recording(key, lambda: self._record_proposal(context, rows, k))
        self._replay(recorded, block_table(context.length, root_id, self.model.config.mask_token_id, rows, start))
        return tuple(self.ops.to_host(a) for a in recorded.outputs)

    def fits(self, features: list) -> bool:
        """Whether `extend` takes these rows (no more than the staging buffers hold)."""
        return features[0].shape[0] <= self.staging[0].shape[0]

    def extend(self, context, features: list, position: int, kept: list) -> None:
        """model.extend(context, features, position, kept), from its recording, for features of `fits` rows. The
        features are staged whole (a window's arrays, as they are: a block's rows need no slice, a tree's path no
        gather), and the table commits the `kept` rows."""
        given, staged = features[0].shape[0], self.staging[0].shape[0]
        assert position >= context.next_position, f"rows at {position} would go before the context's end"
        self.model.reserve(context, staged)
        if given not in self.staged_rows:
            self.staged_rows[given] = [s[:given] for s in self.staging]
        for staging, feature in zip(self.staged_rows[given], features):
            self.ops.copy_into(staging, feature)
        key = ("extend", tuple(id(b) for b in context.buffers()))
        recorded = self._recording(key, lambda: self._record_extend(context))
        self._replay(recorded, extend_table(context.length, position, kept, staged))
        context.commit(position, len(kept))

    def _recording(self, key, record) -> Recorded:
        """The recording for `key`, made by `record()` if there is none; the least recently used past capacity go."""
        recorded = self.recordings.get(key)
        if recorded is None:
            recorded = self.recordings[key] = record()
            self.recorded += 1
            while len(self.recordings) > self.capacity:
                self.recordings.popitem(last=False)
        self.recordings.move_to_end(key)
        return recorded

    def _replay(self, recorded: Recorded, table) -> None:
        """The integers into the recording's host buffer, once its last replay has copied them out (a wait for that
        replay alone: a target round replayed ahead runs on), then a replay."""
        recorded.graph.wait()
        recorded.integers[...] = table
        recorded.graph.replay()
        self.replayed += 1

    def _record(self, shape, work) -> Recorded:
        """Record `work(table)` over a fixed device table of `shape`, filled from pinned host memory first."""
        integers, readable = self.ops.mapped(shape, np.int32)
        table = self.ops.upload(np.zeros(shape, np.int32))
        with graphs.Recording(self.ops.stream) as recording:
            self.ops.copy_into(table, readable)  # the kernels after it read device memory, not the host's, each time
            outputs = work(table)
        return Recorded(recording.graph, integers, outputs)

    def _record_proposal(self, context, rows: int, k: int) -> Recorded:
        buffer_rows = context.keys[0].shape[0]  # the attention's chunks cover the whole buffer: key counts change
        return self._record((4, rows), lambda table: self.ops.topk_on_device(
            self.model.block(context, table, buffer_rows), k))

    def _record_extend(self, context) -> Recorded:
        def write(table):
            self.model.write_context(context, self.staging, table)
            return ()
        return self._record((2, self.staging[0].shape[0]), write)
