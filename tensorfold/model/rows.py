"""A round's rows: each stream's window (a chain or a tree of rows continuing its cache), the window's index maps,
and the round's per-row integers on the backend.

A window continues one stream: a prompt chunk, one decode row, a drafted chain, or a drafted tree. Its index maps
(tensorfold/numerics/paths.py) tell each row which rows are its ancestors, so the conv, the DeltaNet scan and
attention run every row of a window, chain or tree, in one launch.
"""
import dataclasses
import functools
import weakref

import numpy as np

from tensorfold.model.cache import StreamState
from tensorfold.numerics import paths  # defines: chain, depths, path_slots, conv_taps (host NumPy, no numba)


@dataclasses.dataclass(frozen=True)
class RowMaps:
    """A window's index maps on the backend: with them the conv, the DeltaNet scan and attention each run every row of
    the window, chain or tree, in one launch."""
    depths: object  # [rows] int32: each row's ancestors in the window
    path_slots: object  # [rows, deepest + 1] int32: row r's ancestors' slots, root first, then r
    conv_taps: object  # [rows, K] int32: row r's conv window, as rows of [conv tail; window inputs]

    @staticmethod
    def padded(parents, width: int) -> np.ndarray:
        """A tree's maps as one int32 vector whose size depends on its rows n only (a recorded round rewrites it
        each replay, whatever the tree's shape): depths [n], path_slots padded with zeros to [n, n], conv_taps
        [n, width]. The padding is never read: of row r's slots the scan reads 0 .. depth(r) - 1 and attention
        0 .. depth(r) (its keys past the stream's), and the conv reads conv_taps alone."""
        rows, row_paths = len(parents), paths.row_paths(parents)
        flat = [len(path) - 1 for path in row_paths]
        for path in row_paths:
            flat += path + [0] * (rows - len(path))
        for taps in paths.conv_tap_rows(parents, width):
            flat += taps
        return np.array(flat, np.int32)

    @staticmethod
    def padded_size(rows: int, width: int) -> int:
        """The length of a `padded` vector of a tree of `rows` rows."""
        return rows * (1 + rows + width)

    @classmethod
    def over(cls, vector, rows: int, width: int) -> "RowMaps":
        """The maps as views of a `padded` vector of a tree of `rows` rows (on the backend)."""
        return cls(vector[:rows], vector[rows:rows + rows * rows].reshape(rows, rows),
                   vector[rows + rows * rows:].reshape(rows, width))


_CHAIN_MAPS = weakref.WeakKeyDictionary()  # backend -> {rows: RowMaps}: a chain's maps depend only on its length


@dataclasses.dataclass(frozen=True)
class RoundInputs:
    """The per-row integers of a round, on the backend, uploaded once: each row's token id, its position (its
    stream's length + its depth), the keys it reads (position + 1), the cache row its key and value go to (its
    stream's length + its slot in the window), and its stream's length. A recorded round (replay.py) reads them
    from a buffer that is rewritten before each replay."""
    ids: object
    positions: object
    n_keys: object
    write_at: object
    committed: object
    recorded: bool = False  # the attention's chunks cover each stream's whole cache (key counts change per replay)
    in_place: bool = False  # a recorded one-row round: the scan and the conv write over the stored state and tail
    lanes: object = None  # in such a round of one lane pool's streams: each window's lane, int32 (one scan launch)

    ROWS = 5  # the table's rows: ids, positions, n_keys, write_at, committed

    @staticmethod
    def table(windows) -> np.ndarray:
        """[ROWS, rows] int32 on the host, window after window. (Built from Python lists: a decode round's windows
        are one row each, and NumPy calls a window cost more than its rows.)"""
        ids = [token for win in windows for token in win.ids]
        positions = [position for win in windows for position in win.positions]
        write_at = [win.state.length + slot for win in windows for slot in range(len(win.ids))]
        committed = [win.state.length for win in windows for _ in win.ids]
        return np.array([ids, positions, [p + 1 for p in positions], write_at, committed], np.int32)

    @classmethod
    def on(cls, ops, table, recorded=False, in_place=False, lanes=None) -> "RoundInputs":
        """The inputs over a [ROWS, rows] table on the backend (uploaded if it is a host array)."""
        table = ops.upload(table) if isinstance(table, np.ndarray) else table
        return cls(*(table[n] for n in range(cls.ROWS)), recorded, in_place, lanes)


@dataclasses.dataclass
class Window:
    """One stream's rows in a round: `ids` continue `state`; logits for "all" rows or the "last".

    Without `parents` the rows are a chain (row r follows row r - 1). With them they are a tree: `parents[r]` is the
    row that row r follows (-1 for row 0, the root, which follows the stream), always an earlier row. A row sits at
    position length + its depth, and sees the stream and its own ancestors, never its siblings."""
    state: StreamState
    ids: list
    logits_for: str = "all"
    parents: list | None = None
    features: list | None = None  # after a forward with taps: each tapped layer's output at the window's rows
    padding: int = 0  # rows at the end that only fill a recorded round's shape: computed, never walked or kept
    issued_at: int | None = None  # replayed ahead: the stream's length when issued, its one row kept then

    @property
    def used(self) -> int:
        """The rows that count: the decode row and its drafts, without the padding."""
        return len(self.ids) - self.padding

    @property
    def parent_rows(self) -> list:
        """`parents`, or a chain's."""
        return paths.chain(len(self.ids)) if self.parents is None else self.parents

    @property
    def depths(self) -> list:
        if self.parents is None:  # a chain: row r at depth r
            return list(range(len(self.ids)))
        for r, parent in enumerate(self.parent_rows):
            assert (r == 0) == (parent == -1) and parent < r, f"row {r}: parent {parent} must be an earlier row"
        return paths.depths(self.parent_rows).tolist()

    @property
    def positions(self) -> list:
        """Each row's position: its stream's committed length plus its depth."""
        return [self.state.length + depth for depth in self.depths]

    @functools.cached_property
    def maps(self) -> RowMaps:
        """The index maps, built and uploaded once a round (they do not depend on the stream's length); a chain's
        once per backend and length."""
        if self.parents is None:
            chains = _CHAIN_MAPS.setdefault(self.state.ops, {})
            if len(self.ids) not in chains:
                chains[len(self.ids)] = self._build_maps()
            return chains[len(self.ids)]
        return self._build_maps()

    @property
    def padded_maps(self) -> np.ndarray:
        """A tree's maps on the host, as `RowMaps.padded` lays them out."""
        return RowMaps.padded(self.parent_rows, self.state.config.linear_conv_kernel_dim)

    def _build_maps(self) -> RowMaps:
        parents, ops = self.parent_rows, self.state.ops
        width = self.state.config.linear_conv_kernel_dim
        return RowMaps(ops.upload(paths.depths(parents)), ops.upload(paths.path_slots(parents)),
                       ops.upload(paths.conv_taps(parents, width)))

    def ancestors(self, r: int) -> list:
        """Row r's ancestors in the window, nearest first."""
        chain = []
        while self.parent_rows[r] >= 0:
            r = self.parent_rows[r]
            chain.append(r)
        return chain
