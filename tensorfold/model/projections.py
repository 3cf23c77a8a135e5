"""Projection stacking: the projections of a layer that read the same x, uploaded as one weight where they share a
form, so that one GEMV computes them all.

Each output's sum depends only on its own weight row and x, so a stacked GEMV gives every output the bits of its
own projection's.
"""
import dataclasses

import numpy as np

# The projections of a layer that read the same x, in the order a layer uses their outputs: each group whose weights
# share a form runs as one GEMV over their rows stacked (one launch instead of up to four).
PROJECTIONS = {"linear_attn.": ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"),
               "self_attn.": ("q_proj", "k_proj", "v_proj"), "mlp.": ("gate_proj", "up_proj")}


def stacked_rows(linears: list):
    """One Linear holding the rows of `linears` (same form and width) one after another."""
    first = linears[0]
    stack = lambda field: None if getattr(first, field) is None else np.concatenate(  # noqa: E731
        [getattr(w, field) for w in linears])
    return dataclasses.replace(first, out_features=sum(w.out_features for w in linears), data=stack("data"),
                               scales=stack("scales"), biases=stack("biases"))


def rows_of(linear, start: int, stop: int):
    """Rows start .. stop - 1 of a Linear, as views of its arrays (NumPy or device arrays alike)."""
    view = lambda a: None if a is None else a[start:stop]  # noqa: E731
    return dataclasses.replace(linear, out_features=stop - start, data=view(linear.data),
                               scales=view(linear.scales), biases=view(linear.biases))


def form(linear) -> tuple:
    """What two Linears must share to be stacked."""
    return linear.kind, linear.in_features, linear.bits, linear.group_size


def stack_projections(prefix: str, names: tuple, weights: dict, upload) -> tuple:
    """Upload the projections `names` of `prefix` (taken out of `weights`) as stacks of neighbours of one form.

    Returns the stacks, as (weight, output widths) pairs in order, and each projection's weight by its full name as
    a view of the rows it has in its stack (so no weight is held twice)."""
    runs = []  # neighbouring projections of one form: [(name, Linear), ...] each
    for name in names:
        linear = weights.pop(prefix + name + ".weight")
        if runs and form(runs[-1][-1][1]) == form(linear):
            runs[-1].append((name, linear))
        else:
            runs.append([(name, linear)])
    stacks, views = [], {}
    for run in runs:
        stacked = upload(stacked_rows([linear for _, linear in run]))
        widths = [linear.out_features for _, linear in run]
        stacks.append((stacked, widths))
        for (name, _), start, width in zip(run, np.cumsum([0] + widths), widths):
            views[prefix + name + ".weight"] = rows_of(stacked, int(start), int(start) + width)
    return stacks, views
