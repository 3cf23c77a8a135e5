"""The kernel contract: every kernel equals its twin bit for bit, and every planted control turns its check red.

In CI the kernels run under numba's CUDA simulator at tiny shapes; `pytest --gpu` runs them on the GPU at the
real shapes of Qwen3.5-0.8B and 2B.
"""
import pathlib
import re

import pytest

from tensorfold.contract import FAMILIES, registry, run_check, summary_line

CHECKS = registry()


def test_every_kernel_file_is_registered():
    folder = pathlib.Path(__file__).resolve().parents[1] / "tensorfold" / "cuda"
    with_kernels = {p.stem for p in folder.glob("*.py") if re.search(r"^def \w+_kernel\(", p.read_text(), re.M)}
    assert with_kernels <= set(FAMILIES), f"kernel files missing from the contract: {with_kernels - set(FAMILIES)}"


@pytest.mark.parametrize("check", CHECKS, ids=[c.name for c in CHECKS])
def test_kernel_equals_twin_and_controls_turn_red(check, on_gpu):
    result = run_check(check, "gpu" if on_gpu else "sim")
    assert result.cases > 0
    assert not result.failed_cases, f"{check.name}: not bit-equal on {result.failed_cases}"
    assert not result.missed_controls, f"{check.name}: controls that did not turn red: {result.missed_controls}"
    assert result.red_controls, f"{check.name} has no planted control"


def test_gemv_tiles_of_wide_warps(monkeypatch, on_gpu):
    """The kernels of calls with warps to spare, which no shape of the simulator's has: the tile kernel's warps of
    WIDE_OUTPUTS outputs and the one-row kernel's of ROW_OUTPUTS, against the twin with the same planted controls:
    every affine call made wide."""
    from tensorfold.cuda import gemv
    monkeypatch.setattr(gemv, "WIDE_WARPS", 0)
    monkeypatch.setattr(gemv, "ROW_WIDE_WARPS", 0)
    checks = [c for c in CHECKS if c.name.startswith("gemv_affine")]
    assert len(checks) == 4
    for check in checks:
        result = run_check(check, "gpu" if on_gpu else "sim")
        assert result.cases > 0 and not result.failed_cases, f"{check.name}: not bit-equal on {result.failed_cases}"
        assert result.red_controls and not result.missed_controls, f"{check.name}: {result.missed_controls}"
    shapes = gemv.gemv_affine_kernel.shapes
    assert any(tile > 0 and per_warp == gemv.WIDE_OUTPUTS for tile, per_warp, *_ in shapes)
    assert any(tile == 0 and per_warp == gemv.ROW_OUTPUTS for tile, per_warp, *_ in shapes)


def test_summary_line():
    from tensorfold.contract import Result
    results = [Result("a", 2, [], ["x", "y"], [], 0.1), Result("b", 1, ["1x1"], ["z"], ["w"], 0.1)]
    assert summary_line(results) == "SUMMARY 2 kernels: 1 pass, 1 fail; 4 controls: 3 red as planted, 1 missed"
