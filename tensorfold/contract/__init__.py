"""The kernel contract: every kernel is registered with its twin, the shapes it is checked at, and planted
controls; `tensorfold contract [--gpu]` checks them all.

A check runs the twin on the host and the kernel on the device (the GPU, or numba's CUDA simulator) on the same
inputs and passes when every output is equal byte for byte. A control plants a bug the check exists to catch (two
rows swapped, a row dropped, a position off by one, a wrong group index, a moved chunk boundary...) by changing
what the kernel is given; the control is "red as planted" when the check then fails. A check whose controls do not
all turn red proves nothing, so a missed control counts as a failure of the contract.

Each kernel family, `tensorfold/cuda/<family>.py`, has its checks in `tensorfold/contract/<family>.py`: a
`CONTRACT` list of `KernelCheck`s with the cases, launches and controls they need. This module gathers them;
`controls.py` holds the controls that several families plant.
"""
import dataclasses
import importlib
import time
from collections.abc import Callable

import numpy as np

FAMILIES = ("fmath", "weights", "gemv", "quantize", "gemm", "rmsnorm", "elementwise", "conv", "deltanet", "rope",
            "attention", "kv", "argmax", "sampling", "topk", "moe", "experts", "ptx")


@dataclasses.dataclass
class KernelCheck:
    """One kernel against its twin.

    `cases(mode, rng)` returns a list of (label, inputs) for mode "sim" (tiny shapes) or "gpu" (the real shapes
    of Qwen3.5-0.8B and 2B plus awkward ones). `twin(**inputs)` returns the expected output(s) on the host;
    `launch(**inputs)` runs the kernel on device copies and returns its output(s) on the host. Each control maps
    the inputs to the planted-bug inputs the kernel then gets. `kernels` names what the launch runs: the
    `@cuda.jit` functions (kernels, or the device functions a test kernel calls) and kernel factories of
    `tensorfold/cuda`, for a reader to find beside the twin.
    """
    name: str
    twin: Callable
    launch: Callable
    cases: Callable
    controls: dict = dataclasses.field(default_factory=dict)  # name -> inputs -> planted inputs (or None)
    kernels: tuple = ()


def outputs_equal(expected, got) -> bool:
    """Byte equality of one output or a tuple of outputs."""
    if not isinstance(expected, tuple):
        expected, got = (expected,), (got,)
    return all(np.asarray(e, np.float32).tobytes() == np.asarray(g, np.float32).tobytes()
               for e, g in zip(expected, got, strict=True))


def registry() -> list[KernelCheck]:
    """Every registered kernel check, family by family."""
    checks = []
    for family in FAMILIES:
        checks.extend(importlib.import_module(f"tensorfold.contract.{family}").CONTRACT)
    return checks


@dataclasses.dataclass
class Result:
    name: str
    cases: int
    failed_cases: list
    red_controls: list
    missed_controls: list
    seconds: float

    @property
    def passed(self) -> bool:
        return not self.failed_cases


def run_check(check: KernelCheck, mode: str, seed: int = 0) -> Result:
    """Run every case of one check, then every control on the first case it turns red on."""
    started = time.perf_counter()
    cases = check.cases(mode, np.random.default_rng(seed))
    failed = [label for label, inputs in cases if not outputs_equal(check.twin(**inputs), check.launch(**inputs))]
    red, missed = [], []
    for control, plant in check.controls.items():
        planted = [(inputs, plant(dict(inputs))) for _, inputs in cases]
        caught = any(not outputs_equal(check.twin(**inputs), check.launch(**bad))
                     for inputs, bad in planted if bad is not None)  # None: the bug cannot occur at that shape
        (red if caught else missed).append(control)
    return Result(check.name, len(cases), failed, red, missed, time.perf_counter() - started)


def summary_line(results: list[Result]) -> str:
    passed = sum(r.passed for r in results)
    red = sum(len(r.red_controls) for r in results)
    missed = sum(len(r.missed_controls) for r in results)
    return (f"SUMMARY {len(results)} kernels: {passed} pass, {len(results) - passed} fail; "
            f"{red + missed} controls: {red} red as planted, {missed} missed")


def run_contract(mode: str, only: str | None = None, echo=print) -> list[Result]:
    """Check every registered kernel (or those whose name contains `only`), printing a line per kernel."""
    results = []
    for check in registry():
        if only and only not in check.name:
            continue
        result = run_check(check, mode)
        status = "PASS" if result.passed else "FAIL " + ", ".join(result.failed_cases)
        controls = ", ".join(result.red_controls) or "none"
        line = f"{status} {check.name}: {result.cases} cases bit-equal to the twin; controls red as planted: {controls}"
        if result.missed_controls:
            line += "; MISSED: " + ", ".join(result.missed_controls)
        echo(f"{line} ({result.seconds:.1f} s)")
        results.append(result)
    echo(summary_line(results))
    return results
