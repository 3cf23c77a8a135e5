"""The kernel contract: every kernel equals its twin bit for bit, and every planted control turns its check red.

In CI the kernels run under numba's CUDA simulator at tiny shapes; `pytest --gpu` runs them on the GPU at the
real shapes of Qwen3.5-0.8B and 2B.
"""
import pathlib
import re
import sys

import pytest

from tensorfold.contract import FAMILIES, KernelCheck, registry, run_check, summary_line
from tensorfold.contract import experts as experts_contract
from tensorfold.contract import gemm as gemm_contract
from tensorfold.numerics.floats import fma_rn_twin

CHECKS = registry()
# the tensor-core checks (gemm.py, experts.py) are the slow ones under the simulator: test_contract_tensor_cores.py
# runs them, so that pytest-xdist's --dist loadfile gives them a worker of their own
TENSOR_CORE_CHECKS = [c for c in CHECKS if c in gemm_contract.CONTRACT + experts_contract.CONTRACT]
PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "tensorfold"


def families_without_contract(cuda_folder: pathlib.Path, contract_folder: pathlib.Path, families) -> set:
    """The kernel files of `cuda_folder` (a file that defines a `@cuda.jit` function, a kernel or a kernel factory)
    with no contract file of the same name in `contract_folder`, or missing from `families`; and the families with
    no kernel file."""
    kernel_files = {p.stem for p in cuda_folder.glob("*.py")
                    if re.search(r"^(@kernel|@cuda\.jit|def \w+_kernel\()", p.read_text(), re.MULTILINE)}
    contracts = {p.stem for p in contract_folder.glob("*.py")} - {"__init__", "controls"}
    return (kernel_files - (contracts & set(families))) | (set(families) - kernel_files)


def kernels_outside_cuda(check: KernelCheck) -> list:
    """What is wrong with a check's `kernels`: none named, or one that is not an object defined at the top of a
    file of tensorfold/cuda (a `@cuda.jit` function, a kernel factory)."""
    if not check.kernels:
        return [f"{check.name} names no kernel"]
    wrong = []
    for named in check.kernels:
        function = getattr(named, "py_func", named)  # a @cuda.jit function's Python source
        module = sys.modules.get(getattr(function, "__module__", ""))
        name = getattr(function, "__name__", repr(named))
        if (module is None or not module.__name__.startswith("tensorfold.cuda.")
                or getattr(module, name, None) is not named):
            wrong.append(f"{check.name}: {name} is not defined in tensorfold/cuda")
    return wrong


def test_every_kernel_file_is_registered():
    assert families_without_contract(PACKAGE / "cuda", PACKAGE / "contract", FAMILIES) == set()


def test_a_kernel_file_without_its_contract_is_caught(tmp_path):
    """Control: a kernel family with no contract file, and a family with no kernel file."""
    (tmp_path / "cuda").mkdir()
    (tmp_path / "contract").mkdir()
    (tmp_path / "cuda" / "norm.py").write_text("@kernel\ndef norm_kernel(x):\n    pass\n")
    (tmp_path / "cuda" / "scan.py").write_text("def scan_kernel(dk):\n    pass\n")
    (tmp_path / "contract" / "scan.py").write_text("CONTRACT = []\n")
    assert families_without_contract(tmp_path / "cuda", tmp_path / "contract", ["scan"]) == {"norm"}
    assert families_without_contract(tmp_path / "cuda", tmp_path / "contract", ["scan", "gone"]) == {"norm", "gone"}


@pytest.mark.parametrize("check", CHECKS, ids=[c.name for c in CHECKS])
def test_every_check_names_its_kernels(check):
    assert kernels_outside_cuda(check) == []


def test_a_check_without_its_kernels_is_caught():
    """Controls: a check that names no kernel, and one that names a twin from outside tensorfold/cuda."""
    check = CHECKS[0]
    unnamed = KernelCheck(check.name, check.twin, check.launch, check.cases, check.controls)
    assert kernels_outside_cuda(unnamed) == [f"{check.name} names no kernel"]
    twin_named = KernelCheck("fma_rn", fma_rn_twin, check.launch, check.cases, kernels=(fma_rn_twin,))
    assert kernels_outside_cuda(twin_named) == ["fma_rn: fma_rn_twin is not defined in tensorfold/cuda"]


def kernel_equals_twin_and_controls_turn_red(check, on_gpu):
    result = run_check(check, "gpu" if on_gpu else "sim")
    assert result.cases > 0
    assert not result.failed_cases, f"{check.name}: not bit-equal on {result.failed_cases}"
    assert not result.missed_controls, f"{check.name}: controls that did not turn red: {result.missed_controls}"
    assert result.red_controls, f"{check.name} has no planted control"


OTHER_CHECKS = [c for c in CHECKS if c not in TENSOR_CORE_CHECKS]


@pytest.mark.parametrize("check", OTHER_CHECKS, ids=[c.name for c in OTHER_CHECKS])
def test_kernel_equals_twin_and_controls_turn_red(check, on_gpu):
    kernel_equals_twin_and_controls_turn_red(check, on_gpu)


def test_every_check_runs_in_one_of_the_two_files():
    assert sorted(c.name for c in OTHER_CHECKS + TENSOR_CORE_CHECKS) == sorted(c.name for c in CHECKS)


def test_summary_line():
    from tensorfold.contract import Result
    results = [Result("a", 2, [], ["x", "y"], [], 0.1), Result("b", 1, ["1x1"], ["z"], ["w"], 0.1)]
    assert summary_line(results) == "SUMMARY 2 kernels: 1 pass, 1 fail; 4 controls: 3 red as planted, 1 missed"


def test_a_new_device_array_in_the_simulator_holds_nothing_a_kernel_would_write(on_gpu):
    """Under the simulator a new device array holds NaNs (floats), -1 (signed) or the largest value (unsigned), not a
    freed array's values (device/simulator.py), so that every check sees an output its kernel left unwritten. The
    first array has the size of one just freed, whose values it would otherwise be likely to hold."""
    if on_gpu:
        pytest.skip("the simulator's device arrays: on a GPU new memory holds what it holds")
    import numpy as np
    from numba import cuda
    freed = cuda.to_device(np.arange(6, dtype=np.float32))
    del freed
    assert np.isnan(cuda.device_array(6, np.float32).copy_to_host()).all()
    assert (cuda.device_array((2, 3), np.int32).copy_to_host() == -1).all()
    assert (cuda.device_array(4, np.uint32).copy_to_host() == np.iinfo(np.uint32).max).all()
