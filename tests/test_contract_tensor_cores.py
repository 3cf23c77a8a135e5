"""The kernel contract's tensor-core checks (tensorfold/contract/gemm.py and experts.py), in a file of their own: under
the simulator they take most of the contract's time, and --dist loadfile runs each file whole on one worker."""
import pytest

from test_contract import TENSOR_CORE_CHECKS, kernel_equals_twin_and_controls_turn_red


@pytest.mark.parametrize("check", TENSOR_CORE_CHECKS, ids=[c.name for c in TENSOR_CORE_CHECKS])
def test_kernel_equals_twin_and_controls_turn_red(check, on_gpu):
    kernel_equals_twin_and_controls_turn_red(check, on_gpu)
