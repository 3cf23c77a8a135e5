"""Which launches `route_group_launch` (tensorfold/cuda/moe.py) takes: a round of up to GROUPED_ROWS rows routes and
groups in one block (`route_group_kernel`), more rows, or more than 32 pairs a row, in the router and the grouping's
own kernels. The contract's `moe_route_group` checks both forms' bits against the twins; these tests check that the
one-launch form is the one a decode round takes, so that a condition that never chose it could not pass unseen. The
control: one row more than a block routes takes the three launches, which the spy tells apart."""
import numpy as np
import pytest
from numba import cuda

from tensorfold.cuda import moe
from tensorfold.device.launch import CachedLaunch


@pytest.fixture
def launched(monkeypatch):
    """The names of the kernels launched, in order (every kernel launches through CachedLaunch)."""
    names, launch = [], CachedLaunch.launch

    def recorded(self, *args):
        names.append(self.__name__)
        return launch(self, *args)
    monkeypatch.setattr(CachedLaunch, "launch", recorded)
    return names


def route_and_group(rows, routed, k, shared=True):
    logits = np.random.default_rng(rows).normal(size=(rows, routed)).astype(np.float32)
    return moe.route_group_launch(cuda.to_device(logits), k, routed + shared, shared)


def test_a_rounds_rows_route_and_group_in_one_launch(launched):
    route_and_group(3, 8, 2)
    route_and_group(moe.GROUPED_ROWS, 8, 2)
    assert launched == ["route_group", "route_group"]


def test_control_more_rows_than_one_block_take_three_launches(launched):
    route_and_group(moe.GROUPED_ROWS + 1, 8, 2)
    assert launched == ["route", "group_kernel", "tile_kernel"]


def test_more_than_32_pairs_a_row_take_three_launches(launched):
    route_and_group(1, 40, 32)  # 32 experts and the shared one: 33 pairs, more than the row's warp has threads
    assert launched == ["route", "group_kernel", "tile_kernel"]
