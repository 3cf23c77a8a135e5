"""A stream's cache and the deferred keep: what a stream has committed, and how a window's rows are kept.

A forward leaves each stream's cache as it was and records what the window would add; `StreamState.keep(n)` then
commits the first n rows (all of them for a prompt chunk or a decode row, the accepted prefix of a drafted chain),
and `keep_path` the path a tree's walk accepted: the DeltaNet state replays the scan's log for those rows, the conv
tail moves along them, a tree's kept key/value rows move down to length + depth, and the rows past them are left to
be overwritten.
"""
import dataclasses

from tensorfold.model.config import ModelConfig


@dataclasses.dataclass
class DeltaNetRecord:
    """What one window did to one DeltaNet layer, kept until the stream keeps some of its rows."""
    before: object  # the state the scan started from
    after: object  # the state after the window's last row (along its path, in a tree)
    log: tuple  # (decay, delta, key) per row: replaying a path's rows in order gives the state after its last row
    inputs: object  # the raw conv inputs of the window's rows
    tail: object  # the conv tail the window started from
    new_tail: object  # the conv tail after the window's last row (along its path, in a tree)


@dataclasses.dataclass(frozen=True)
class KeepPolicy:
    """The deferred keep. With `late`, the DeltaNet rows a stream keeps from a drafted window are not applied to
    its state at once: they wait in the stream's pending buffer, and the next scan, which loads the state anyway,
    replays them first. The state is written back at a one-row window, at a prompt chunk, when `threshold` rows
    are pending, when a kept path does not fit in the `capacity` left, or when the path is not the window's first
    rows (a tree's branch: its log rows would be gathered one by one, where the immediate keep reads them in
    place). Replaying uses the scan's own fp32 steps in the same order, so every output keeps its bits. It applies to
    eager rounds: a drafted round replayed from a CUDA graph keeps its rows through its recorded keep (`keep_row`,
    model/replay.py), never pending."""
    late: bool = True
    threshold: int = 24
    capacity: int = 48


def pending_row_bytes(config: ModelConfig) -> int:
    """Bytes one pending row takes: the decay, delta and key of every value head of every DeltaNet layer."""
    c = config
    return 4 * c.layer_types.count("linear_attention") * c.linear_num_value_heads * (
        1 + c.linear_value_head_dim + c.linear_key_head_dim)


class LanePool:
    """The DeltaNet states and conv tails of an engine's lanes, one array a layer ([lanes, nv, dk, dv] and
    [lanes, K - 1, C]): lane n's are views of row n, so that a round of one-row windows convolves and scans every
    lane's in one launch each (`ops.causal_conv_lanes`, `ops.deltanet_scan_lanes`)."""

    def __init__(self, config: ModelConfig, ops, lanes: int):
        c = config
        layers = [i for i, kind in enumerate(c.layer_types) if kind == "linear_attention"]
        self.lanes = lanes
        self.states = {i: ops.zeros((lanes, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim))
                       for i in layers}
        self.tails = {i: ops.zeros((lanes, c.linear_conv_kernel_dim - 1, c.conv_dim)) for i in layers}


class StreamState:
    """One stream's cache: its committed length, and per layer the DeltaNet state, conv tail and pending rows, or
    the attention keys and values (post-norm, post-RoPE; buffers that grow, of which rows [0, length) are
    committed). With a `pool`, its DeltaNet states and conv tails are views of lane `lane`'s rows there."""

    def __init__(self, config: ModelConfig, ops, max_rows: int | None = None, policy: KeepPolicy = KeepPolicy(),
                 pool: LanePool | None = None, lane: int = 0):
        c = self.config = config
        self.ops, self.policy = ops, policy
        self.pool, self.lane = pool, lane
        self.max_rows = max_rows  # key/value buffers never grow past this (the engine's context), if set
        self.length = 0
        self.window_rows = 0  # rows of the last forward not yet kept or dropped
        self.kept_on_device = False  # a replayed one-row round has already written its row into the cache
        self.keep_row = None  # a replayed drafted round's row of its recorded keep's buffer (model/replay.py)
        self.pending_rows = 0  # kept DeltaNet rows not yet applied to `recurrent` (the same count in every layer)
        self.pending = {}  # layer -> (decay, delta, key) of the pending rows, in path order
        self.recurrent, self.conv_tail, self.keys, self.values, self.records = {}, {}, {}, {}, {}
        self.home = {}  # layer -> (state, tail): the buffers `settle` copies the DeltaNet results into
        self.kv_home = {}  # layer -> (keys, values): the buffers `reserve` grows and `settle` copies a restore into
        for i, kind in enumerate(c.layer_types):
            if kind == "linear_attention":
                self.recurrent[i] = pool.states[i][lane] if pool else ops.zeros(
                    (c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim))
                self.conv_tail[i] = pool.tails[i][lane] if pool else ops.zeros((c.linear_conv_kernel_dim - 1,
                                                                                 c.conv_dim))
                self.home[i] = (self.recurrent[i], self.conv_tail[i])
            else:
                self.keys[i] = ops.zeros((0, c.num_key_value_heads, c.head_dim))
                self.values[i] = ops.zeros((0, c.num_key_value_heads, c.head_dim))
                self.kv_home[i] = (self.keys[i], self.values[i])

    @property
    def nbytes(self) -> int:
        """Bytes of the cache, counting the pending buffer at its full capacity."""
        parts = [*self.recurrent.values(), *self.conv_tail.values(), *self.keys.values(), *self.values.values()]
        pending = self.policy.capacity * pending_row_bytes(self.config) if self.policy.late else 0
        return sum(a.nbytes for a in parts) + pending

    def scan_start(self, i):
        """The state layer i's next scan starts from: the stored state with the pending rows replayed."""
        if not self.pending_rows:
            return self.recurrent[i]
        return self.ops.deltanet_apply(self.recurrent[i], self.pending[i], range(self.pending_rows))

    def land(self) -> None:
        """Apply the pending rows to the stored states (before a snapshot, or when the buffer is full enough)."""
        if self.pending_rows:
            for i in self.recurrent:
                self.recurrent[i] = self.scan_start(i)
            self.pending_rows, self.pending = 0, {}

    def _pend(self, i, rows) -> None:
        """Append kept log rows (decay, delta, key) to layer i's pending buffer."""
        self.pending[i] = rows if not self.pending_rows else tuple(
            self.ops.concat_rows([old, new]) for old, new in zip(self.pending[i], rows))

    def _committed(self, n: int, deferred: bool) -> None:
        """After a keep of n rows: the pending count, the length, and a landing at the threshold."""
        if n and self.records:
            self.pending_rows = self.pending_rows + n if deferred else 0
            if not deferred:
                self.pending = {}
        self.length += n
        self.window_rows = 0
        self.records = {}
        if self.pending_rows >= self.policy.threshold:
            self.land()

    def keep(self, n: int, write_back: bool = False) -> None:
        """Commit the first n rows of the last (chain) window (0 <= n <= its rows). Their DeltaNet rows go to the
        pending buffer under a late policy, unless `write_back` (a prompt chunk), the window had one row, or they do
        not fit; then the state is written at once."""
        assert 0 <= n <= self.window_rows, f"cannot keep {n} of {self.window_rows} window rows"
        if self.kept_on_device:  # a replayed one-row round: the device holds the row already, count it
            assert n == 1, "a replayed one-row round keeps its one row"
            self.kept_on_device = False
            self._committed(1, deferred=False)
            return
        self._keep(list(range(n)), write_back)

    def reserve(self, rows: int) -> None:
        """Make room for `rows` more key/value rows past the committed length (growing buffers before a forward
        that must not grow them: a recorded decode round)."""
        for i in self.keys:
            self.keys[i] = self.ops.reserve_rows(self.keys[i], self.length, self.length + rows, self.max_rows)
            self.values[i] = self.ops.reserve_rows(self.values[i], self.length, self.length + rows, self.max_rows)
            self.kv_home[i] = (self.keys[i], self.values[i])

    def reset(self) -> None:
        """Empty the stream, in place, for the next request of its lane (engine.py): zero states and tails, no rows,
        nothing pending or in a window, as a new stream, but in the same buffers, so the recordings keyed by them
        (replay.py) stay valid. The key/value rows stay as they are: no row reads one past the length that its own
        round has not written."""
        zeros = {}  # one zero array a shape: every DeltaNet layer's state, and tail, has the same
        for i, (state, tail) in self.home.items():
            for buffer in (state, tail):
                if buffer.shape not in zeros:
                    zeros[buffer.shape] = self.ops.zeros(buffer.shape)
                self.ops.copy_into(buffer, zeros[buffer.shape])
            self.recurrent[i], self.conv_tail[i] = state, tail
        self.length = self.window_rows = self.pending_rows = 0
        self.kept_on_device, self.keep_row, self.pending, self.records = False, None, {}, {}

    def settle(self) -> None:
        """Put the DeltaNet states and conv tails back in the stream's own buffers, and the keys and values a
        snapshot's restore swapped in (prompt_cache.py): an eager keep points the states and tails at the scan's
        outputs, and a recorded decode round needs the same addresses from round to round."""
        for i, (state, tail) in self.home.items():
            if self.recurrent[i] is not state:
                self.ops.copy_into(state, self.recurrent[i])
                self.recurrent[i] = state
            if self.conv_tail[i] is not tail:
                self.ops.copy_into(tail, self.conv_tail[i])
                self.conv_tail[i] = tail
        for i, own in self.kv_home.items():
            if self.keys[i] is not own[0]:  # grown, if need be, to hold the restored rows
                own = tuple(self.ops.reserve_rows(buffer, 0, self.length, self.max_rows) for buffer in own)
                for buffer, restored in zip(own, (self.keys[i], self.values[i])):
                    self.ops.copy_into(buffer[:self.length], restored[:self.length])
                self.keys[i], self.values[i] = self.kv_home[i] = own

    def commit_in_place(self) -> None:
        """Write the last one-row window's DeltaNet state and conv tail over the stored ones, in place (a recorded
        one-row round, whose replays must find the next round's state at the same addresses)."""
        assert self.window_rows == 1 and not self.pending_rows, "in-place commits are for one-row windows"
        for i, record in self.records.items():
            if record.after is not self.recurrent[i]:  # the scan wrote it in place already, if asked to
                self.ops.copy_into(self.recurrent[i], record.after)
            if record.new_tail is not self.conv_tail[i]:  # and so did the conv
                self.ops.copy_into(self.conv_tail[i], record.new_tail)

    def settled_buffers(self) -> tuple:
        """What a recorded round reads and writes, once `settle` has run: the round is valid while these are the same
        objects. The DeltaNet states and conv tails are then the stream's own (`home`, fixed for its life), so the
        first of them stands for them all; the key/value buffers grow."""
        own = [state for state, _ in self.home.values()][:1]
        return (*own, *self.keys.values(), *self.values.values())

    def keep_path(self, path: list) -> None:
        """Commit a tree window's rows along `path` (the root, then each kept row a child of the one before)."""
        assert self.window_rows and all(0 <= r < self.window_rows for r in path), "keep a path of the last window"
        self._keep(list(path), write_back=False)

    def _keep(self, path: list, write_back: bool) -> None:
        """Commit the last window's rows along `path`: the DeltaNet rows (pending, or into the state), the conv tail
        moved along the path, and a tree path's key/value rows moved from length + slot to length + depth. After a
        replayed drafted round the path only goes to `keep_row`, and the round's recorded keep does all of that."""
        n, rows = len(path), self.window_rows
        if self.keep_row is not None:  # a replayed drafted round: its recorded keep applies the path on the device
            self.keep_row[0], self.keep_row[1:1 + n] = self.length, path
            self.keep_row = None
            self._committed(n, deferred=False)
            return
        p, ops = self.policy, self.ops
        prefix = path == list(range(n))  # a chain's kept rows, or a tree path along its first rows
        defer = p.late and not write_back and rows > 1 and self.pending_rows + n <= p.capacity and prefix
        to_last_row = n > 0 and path[-1] == rows - 1  # the scan's final state and the conv's new tail are this path's
        for i, record in self.records.items():
            if n == 0:
                continue
            if defer:
                self._pend(i, tuple(part[:n] for part in record.log))
            elif to_last_row:
                self.recurrent[i] = record.after  # record.before already had the pending rows replayed
            else:
                self.recurrent[i] = ops.deltanet_apply(record.before, record.log, path)
            self.conv_tail[i] = record.new_tail if to_last_row else self._tail_after(record, path)
        if not prefix:  # a tree's path: its rows were written at length + slot
            for i in self.keys:
                self.keys[i], self.values[i] = ops.kv_compact(self.keys[i], self.values[i], self.length, path)
        self._committed(n, defer)

    def _tail_after(self, record: DeltaNetRecord, path: list):
        """The conv tail after keeping `path`: its last K - 1 inputs, running on into the window's old tail. Runs of
        consecutive rows of one array are taken as slices, so a chain that kept K - 1 rows or more gets a view of
        its inputs (no copy: `settle` copies it home before a replay, as it does the scan's new tail)."""
        history = record.tail.shape[0]
        last = ([(record.tail, s) for s in range(history)] + [(record.inputs, r) for r in path])[-history:]
        runs = []  # [array, first row, end row] of consecutive rows of one array
        for rows, s in last:
            if runs and runs[-1][0] is rows and runs[-1][2] == s:
                runs[-1][2] = s + 1
            else:
                runs.append([rows, s, s + 1])
        parts = [rows[first:end] for rows, first, end in runs]
        return parts[0] if len(parts) == 1 else self.ops.concat_rows(parts)
