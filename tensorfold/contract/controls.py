"""Planted controls shared by the contract's cases: each maps a case's inputs to the inputs of a planted bug, or to
None where that bug cannot occur at the case's shape."""
import numpy as np


def swap_rows(name, a=0, b=1):
    """A planted control: rows a and b of input `name` swapped (None where the input has too few rows)."""
    def plant(inputs):
        if len(inputs[name]) <= max(a, b):
            return None
        x = inputs[name].copy()
        x[[a, b]] = x[[b, a]]
        return {**inputs, name: x}
    return plant


def drop_row(name, row=-1):
    """A planted control: one row of input `name` removed (None where it has only one)."""
    def plant(inputs):
        if len(inputs[name]) < 2:
            return None
        return {**inputs, name: np.delete(inputs[name], row, axis=0)}
    return plant
