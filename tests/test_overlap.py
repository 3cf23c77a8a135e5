"""Overlapped launches (tensorfold/device/graphs.py: on by default on a GPU of compute capability 9.0 on, the switch
TENSORFOLD_OVERLAP): every kernel compiled behind a wait for the kernels before it (launch.waiting), and a recorded
graph whose kernel-to-kernel edges are then programmatic.

The wait must change no bit, and a graph may start a kernel early only where every kernel in it waits. The whole
suite with the switch on (`pytest --gpu` on such a GPU) checks every kernel behind the wait; these tests check
the mechanism, in the simulator and on a GPU, with planted controls: a kernel compiled as written is neither counted
nor, on a GPU, given a programmatic edge.
"""
import numpy as np
import pytest
from numba import cuda

from tensorfold.device import graphs, launch


def scale_add(x, y, out):
    """out = 2 x + y, one thread an element."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = np.float32(2.0) * x[i] + y[i]


def test_the_switch_is_the_environments_else_the_gpus(on_gpu, monkeypatch):
    """TENSORFOLD_OVERLAP=1 or 0 decides; unset, the GPU's compute capability does (9.0 on), and the simulator, which
    has no GPU, compiles the kernels as written."""
    for value, overlap in (("1", True), ("0", False)):
        monkeypatch.setenv("TENSORFOLD_OVERLAP", value)
        assert graphs.overlap_switch() is overlap
    monkeypatch.delenv("TENSORFOLD_OVERLAP")
    if on_gpu:
        assert graphs.overlap_switch() == (cuda.get_current_device().compute_capability >= (9, 0))
    else:
        assert graphs.overlap_switch() is False


def compiled(overlap: bool, monkeypatch):
    """scale_add through launch.kernel, with the switch as given."""
    monkeypatch.setattr(graphs, "OVERLAP", overlap)
    return launch.kernel(scale_add)


def test_a_waiting_kernel_computes_what_it_wraps_and_is_counted(monkeypatch):
    """The waiting form gives the plain kernel's bits, keeps the kernel as written as its py_func, and a recording
    counts its launches as waiting ones. Control: the plain kernel's launch is not counted."""
    plain, waiting = compiled(False, monkeypatch), compiled(True, monkeypatch)
    assert (plain.waits, waiting.waits) == (False, True) and waiting.py_func is scale_add
    rng = np.random.default_rng(0)
    x, y = (cuda.to_device(rng.normal(size=300).astype(np.float32)) for _ in range(2))
    outs = {}
    for name, kernel in (("plain", plain), ("waiting", waiting)):
        outs[name] = cuda.device_array(300, np.float32)
        kernel[2, 256](x, y, outs[name])
    assert outs["waiting"].copy_to_host().tobytes() == outs["plain"].copy_to_host().tobytes()
    stream = cuda.stream()
    for kernel, counted in ((waiting, 1), (plain, 0)):
        with graphs.Recording(stream) as recording:
            kernel[2, 256, stream](x, y, outs["plain"])
        assert recording.waiting_kernels == counted


@pytest.mark.gpu
def test_overlapped_edges_only_where_every_kernel_waits(monkeypatch):
    """On a GPU a recorded chain of waiting kernels gets a programmatic edge and computes what the chain does.
    Control: a graph that also holds a kernel compiled as written keeps its plain edges."""
    plain, waiting = compiled(False, monkeypatch), compiled(True, monkeypatch)
    stream = cuda.stream()
    x = cuda.to_device(np.arange(1, 1025, dtype=np.float32), stream=stream)
    y, z = (cuda.device_array(1024, np.float32, stream=stream) for _ in range(2))
    for kernel in (plain, waiting):  # compiled before the recordings
        kernel[4, 256, stream](x, x, y)
    with graphs.Recording(stream) as chain:
        waiting[4, 256, stream](x, x, y)  # y = 3 x
        waiting[4, 256, stream](y, x, z)  # z = 2 y + x = 7 x
    assert chain.graph.overlapped == 1
    chain.graph.replay()
    chain.graph.wait()
    assert np.array_equal(z.copy_to_host(), 7 * np.arange(1, 1025, dtype=np.float32))
    with graphs.Recording(stream) as mixed:
        waiting[4, 256, stream](x, x, y)
        plain[4, 256, stream](y, x, z)
    assert mixed.graph.overlapped == 0


scale_add_device = cuda.jit(device=True)(scale_add)


def scale_add_waiting_inside(x, y, out):
    """scale_add, with the wait placed by the kernel itself: it lets the next kernel launch, then waits."""
    launch.let_next_launch()
    launch.wait_for_inputs()
    scale_add_device(x, y, out)


def test_a_kernel_waiting_inside_computes_its_body_and_is_counted_where_the_wait_is_real():
    """`kernel_waiting_inside` gives scale_add's bits, and a recording counts its launches as waiting ones exactly
    where `wait_for_inputs` waits (on a GPU with the switch on). Control: where the wait is nothing (the simulator, or
    the switch off) its launch is not counted, so no graph holding it is overlapped."""
    inside = launch.kernel_waiting_inside(scale_add_waiting_inside)
    real_wait = launch.wait_for_inputs is not launch.no_wait
    assert real_wait == (graphs.OVERLAP and not launch.SIMULATED)
    assert inside.waits is real_wait
    rng = np.random.default_rng(1)
    x, y = (cuda.to_device(rng.normal(size=300).astype(np.float32)) for _ in range(2))
    out = cuda.device_array(300, np.float32)
    inside[2, 256](x, y, out)
    assert out.copy_to_host().tobytes() == (np.float32(2.0) * x.copy_to_host() + y.copy_to_host()).tobytes()
    with graphs.Recording(cuda.stream()) as recording:
        inside[2, 256, recording.stream](x, y, out)
    assert recording.waiting_kernels == int(real_wait)


@pytest.mark.gpu
def test_a_chain_that_launches_the_next_early_computes_the_chains_values():
    """On a GPU with the switch on, a recorded chain of kernels that each let the next launch at once and wait inside
    gets its programmatic edge, and the second still reads what the first wrote: z = 2 (3 x) + x. Control: the
    chain's edge is programmatic where the wait is real, so the next kernel did launch early (`overlapped`)."""
    inside = launch.kernel_waiting_inside(scale_add_waiting_inside)
    stream = cuda.stream()
    x = cuda.to_device(np.arange(1, 1025, dtype=np.float32), stream=stream)
    y, z = (cuda.device_array(1024, np.float32, stream=stream) for _ in range(2))
    inside[4, 256, stream](x, x, y)  # compiled before the recording
    with graphs.Recording(stream) as chain:
        inside[4, 256, stream](x, x, y)  # y = 3 x
        inside[4, 256, stream](y, x, z)  # z = 2 y + x = 7 x
    assert chain.graph.overlapped == int(inside.waits)
    chain.graph.replay()
    chain.graph.wait()
    assert np.array_equal(z.copy_to_host(), 7 * np.arange(1, 1025, dtype=np.float32))
