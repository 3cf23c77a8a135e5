"""Planted controls shared by the contract's checks: each helper returns a `plant`, which maps a case's inputs to
the inputs of a planted bug, or to None where that bug cannot occur at the case's shape."""
import numpy as np


def _rows(value, order):
    """The rows of an array or a list in `order`."""
    return [value[i] for i in order] if isinstance(value, list) else value[order]


def _index(rows, row):
    """Row `row` (negative: from the end) of `rows` as an index from the front, or None where there is none."""
    return row % rows if -rows <= row < rows else None


def swap_rows(*names, a=0, b=1):
    """Rows a and b (negative: from the end) swapped in every named input alike (None with fewer rows)."""
    def plant(inputs):
        rows = len(inputs[names[0]])
        first, second = _index(rows, a), _index(rows, b)
        if rows < 2 or first is None or second is None:
            return None
        order = list(range(rows))
        order[first], order[second] = second, first
        return {**inputs, **{name: _rows(inputs[name], order) for name in names}}
    return plant


def drop_row(*names, row=-1):
    """Row `row` (negative: from the end; None: the middle one, rows // 2) removed from every named input alike
    (None with fewer than two rows)."""
    def plant(inputs):
        rows = len(inputs[names[0]])
        dropped = rows // 2 if row is None else _index(rows, row)
        if rows < 2 or dropped is None:
            return None
        order = [r for r in range(rows) if r != dropped]
        return {**inputs, **{name: _rows(inputs[name], order) for name in names}}
    return plant


def padding_read(name):
    """A padded path's first -1 read as row 0 (None for a path without padding): a kernel that runs past its end."""
    def plant(inputs):
        path = np.array(inputs[name], np.int32)
        ends = np.flatnonzero(path < 0)
        if not len(ends):
            return None
        path[ends[0]] = 0
        return {**inputs, name: path}
    return plant


def roll(name, axis=1):
    """Input `name` rolled by one place along `axis`, so each entry is read from its neighbour's: a column (an id,
    a group, a head) off by one. None where the input is absent or that axis holds one entry."""
    def plant(inputs):
        value = inputs[name]
        if value is None or value.shape[axis] < 2:
            return None
        return {**inputs, name: np.roll(value, 1, axis=axis)}
    return plant


def off_by(name, amount=1):
    """Input `name` plus `amount`: a position, a length, a row index off by one."""
    return lambda inputs: {**inputs, name: inputs[name] + amount}


def times(name, factor):
    """Input `name` times `factor`: an epsilon off by a factor of ten, a sign flipped."""
    return lambda inputs: {**inputs, name: inputs[name] * factor}


def ties_to_the_higher_id(name="logits", within=lambda inputs: 1):
    """What a selection by (larger value, then lower id) would see if it kept the higher id on ties: every earlier
    copy of a value tied among a row's `within(inputs)` best a hair lower (None where no row holds such a tie)."""
    def plant(inputs):
        logits, best = inputs[name].copy(), within(inputs)
        planted = False
        for row in logits:
            top = np.sort(row)[::-1][:best]
            for value in np.unique(top[np.isfinite(top)]):
                tied = np.flatnonzero(row == value)
                if len(tied) > 1:
                    row[tied[:-1]] = np.nextafter(row[tied[:-1]], np.float32(-np.inf))
                    planted = True
        return {**inputs, name: logits} if planted else None
    return plant


def next_lane(pool):
    """The first window's lane one further on (the last's wraps to lane 0), in a pool of lanes `pool`: a window reading
    and writing another stream's cache."""
    def plant(inputs):
        lanes = inputs["lanes"].copy()
        lanes[0] = (lanes[0] + 1) % len(inputs[pool])
        return {**inputs, "lanes": lanes}
    return plant
