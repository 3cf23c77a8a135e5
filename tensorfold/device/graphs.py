"""CUDA graphs: the launches of a round recorded once, then replayed each round by one driver call.

A decode round launches a few hundred kernels, and numba's host work for each launch takes longer than most of
those kernels run on the GPU. A CUDA graph records the round's launches (each
kernel, its grid, and its arguments: every device pointer and every scalar, fixed) and the driver replays all of
them from one call. So a recorded round is only right if everything that changes from one round to the next is
read from device memory at a fixed address (the round's token ids, positions and stream lengths) and everything the
next round needs is written in place (the keys and values at a device-held position, a one-row round's DeltaNet
states and conv tails, or a drafted round's kept rows, by a second recording replayed after the walk).
tensorfold/model/replay.py builds decode rounds that way; this file records and replays them.

* On a GPU, `Recording` captures the backend's numba stream (`cuStreamBeginCapture`, relaxed mode, so that the
  device pool may still allocate from the driver) and `Graph.replay` is one `cuGraphLaunch` on the same stream.
  Captured launches do not run: the first replay computes the recorded round.
* Under numba's CUDA simulator there is no driver, so `Recording` keeps the list of launches (kernel, grid,
  arguments) without running them and `Graph.replay` runs that list: the same rule, every argument fixed when it
  was recorded, so the CPU tests check that a recorded round reads nothing the host would have to pass anew.

While a recording is open, every kernel launch (tensorfold/device/launch.py) reports its arguments here and the graph
keeps them: an array a graph reads or writes stays alive as long as the graph does, so the device pool cannot hand
its memory to another array. Only kernel launches may be recorded: the backend refuses uploads, downloads and
copies while a recording is open (`CaptureError`), because a replay would not repeat them.

Captured on one stream, a graph is a chain: each kernel waits for the one before. The kernels each stream of a round
runs on its own (its conv, scan, key/value write and attention: a few thousand threads each, far from filling the
GPU) need not wait for another stream's. `Lanes` records them side by side: it forks one side stream per window
from the recording stream (an event recorded there, waited on by each side stream, which joins the side streams
to the capture), puts window n's launches on side stream n, and joins every side stream back (an event recorded
on each, waited on by the recording stream) before the round goes on. The replay then runs those branches
concurrently. Each branch's launches are the eager round's, in its order, on buffers no other branch touches, so
the bits are the same. Outside a recording, and under the simulator, lanes change nothing.

Overlapped launches (on where the GPU has them: compute capability 9.0 on; TENSORFOLD_OVERLAP=0 or 1 decides instead).
Between two kernels of a chain the GPU first finishes the one (its last blocks exit, its writes are flushed), then
launches the next (its grid is set up, its blocks placed and started). `overlap_launches` makes every edge from a kernel
to a kernel of a captured graph *programmatic* (CUDA's programmatic dependent launch): the next kernel is launched as
the blocks of the one before exit, and each of its threads waits in its first instruction (launch.inputs_ready, PTX
`griddepcontrol.wait`) until that kernel has completed and its writes are visible. The launch overlaps the completion;
no kernel reads or writes what another writes while that one runs, so the bits are the chain's. (A round's GEMM
launches while x's quantize runs and loads its weights, which no kernel writes, before it waits: launch.py.) Only
kernels compiled behind that wait (launch.py, with the switch on) may start early, so a graph that holds any other
kernel keeps its plain edges.
"""
import contextlib
import os
import weakref

from tensorfold.device import SIMULATED
from tensorfold.errors import TensorfoldError

if not SIMULATED:
    from cuda.bindings import driver as cu

_open = None  # the Recording in progress, if any (the engine records on its own thread, one round at a time)


def overlap_switch() -> bool:
    """Whether kernels are compiled for overlapped launches: TENSORFOLD_OVERLAP=1 or 0 if set, else whether the GPU
    numba uses first has programmatic dependent launch (compute capability 9.0 on). Asking the driver for a device's
    attributes creates no context, which the device pool must come before (pool.py)."""
    switch = os.environ.get("TENSORFOLD_OVERLAP")
    if switch is not None:
        return switch == "1"
    if SIMULATED:
        return False
    from numba import cuda
    return cuda.is_available() and cuda.gpus[0].compute_capability >= (9, 0)


OVERLAP = overlap_switch()  # read when the kernels are compiled (launch.kernel)


class CaptureError(TensorfoldError):
    """Work that a graph cannot record was issued while a recording was open."""


def recording():
    """The open Recording, or None."""
    return _open


def refuse(what: str) -> None:
    """Raise CaptureError if a recording is open: `what` (a copy, an upload) could not be replayed."""
    if _open is not None:
        raise CaptureError(f"{what} while recording a CUDA graph: a replay would not repeat it")


def _check(result):
    """A cuda.bindings call's result: raise on an error code, else the values after it."""
    error, *values = result if isinstance(result, tuple) else (result,)
    if error != cu.CUresult.CUDA_SUCCESS:
        raise TensorfoldError(f"CUDA graph call failed: {error!r}")
    return values[0] if len(values) == 1 else values


def _edge_call(name):
    """A driver call that takes or gives edge data: `cuGraphGetEdges_v2` and its kin in cuda-bindings 12, the same
    names without `_v2` in 13."""
    return getattr(cu, name + "_v2", None) or getattr(cu, name)


def overlap_launches(graph, waiting_kernels: int) -> int:
    """Make every edge from a kernel to a kernel of `graph` programmatic (see "Overlapped launches" above) when all
    its kernel nodes are the `waiting_kernels` launches recorded behind `inputs_ready`; a graph with any other kernel
    is left as it is. Returns the count of edges made programmatic."""
    kernel = cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL
    nodes = _check(cu.cuGraphGetNodes(graph, _check(cu.cuGraphGetNodes(graph, 0))[-1]))[0]
    if sum(_check(cu.cuGraphNodeGetType(node)) == kernel for node in nodes) != waiting_kernels:
        return 0
    count = _check(_edge_call("cuGraphGetEdges")(graph, 0))[-1]
    sources, targets, data, count = _check(_edge_call("cuGraphGetEdges")(graph, count))
    chosen = [(a, b, d) for a, b, d in zip(sources, targets, data)
              if _check(cu.cuGraphNodeGetType(a)) == kernel and _check(cu.cuGraphNodeGetType(b)) == kernel]
    if not chosen:
        return 0
    sources, targets, data = (list(column) for column in zip(*chosen))
    _check(_edge_call("cuGraphRemoveDependencies")(graph, sources, targets, data, len(chosen)))
    programmatic = cu.CUgraphEdgeData()
    programmatic.from_port = cu.CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC  # no kernel signals early: as its blocks exit
    programmatic.type = cu.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
    _check(_edge_call("cuGraphAddDependencies")(graph, sources, targets, [programmatic] * len(chosen), len(chosen)))
    return len(chosen)


class Recording:
    """`with Recording(stream) as r:` records the kernel launches issued inside; then `r.graph` replays them."""

    def __init__(self, stream):
        self.stream = stream
        self.held = []  # every launch's arguments (and the lanes' events): kept alive with the graph
        self.launches = []  # the simulator's record: (kernel, launch configuration, arguments)
        self.forks = 0  # sets of lanes recorded side by side (`Lanes`)
        self.waiting_kernels = 0  # launches of kernels compiled behind launch.inputs_ready
        self.kernels = 0  # kernel launches recorded
        self.graph = None

    def __enter__(self):
        global _open
        assert _open is None, "one recording at a time"
        if not SIMULATED:
            _check(cu.cuStreamBeginCapture(cu.CUstream(int(self.stream.handle or 0)),
                                           cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED))
        _open = self
        return self

    def __exit__(self, kind, error, traceback):
        global _open
        _open = None
        if SIMULATED:
            if error is None:
                self.graph = Graph(self.stream, self.held, self.launches)
                self.graph.forks, self.graph.kernels = self.forks, self.kernels
            return False
        captured = _check(cu.cuStreamEndCapture(cu.CUstream(int(self.stream.handle or 0))))  # always: frees the stream
        if error is not None:
            _check(cu.cuGraphDestroy(captured))
            return False
        overlapped = overlap_launches(captured, self.waiting_kernels) if self.waiting_kernels else 0
        executable = _check(cu.cuGraphInstantiate(captured, 0))
        self.graph = Graph(self.stream, self.held, self.launches, captured, executable)
        self.graph.forks, self.graph.overlapped, self.graph.kernels = self.forks, overlapped, self.kernels
        return False

    def take(self, kernel, configuration, arguments, waits=False) -> bool:
        """Note a launch (`waits`: of a kernel behind launch.inputs_ready); True when the caller must not launch it
        itself (the simulator records it instead)."""
        self.held.append(arguments)
        self.waiting_kernels += waits
        self.kernels += 1
        if SIMULATED:
            self.launches.append((kernel, configuration, arguments))
            return True
        return False


class Lanes:
    """`with backend.side_by_side(count) as lanes:` then `with lanes.lane(n):` for window n's launches: inside a
    recording, on side stream n of `count`, forked from and joined back to the backend's stream (see above)."""

    def __init__(self, backend, count: int):
        self.backend = backend
        self.recording = _open if count > 1 else None
        self.sides = backend.side_streams(count) if self.recording is not None and not SIMULATED else []
        self.main = backend.stream if self.sides else None  # only a backend that records has a stream

    def __enter__(self):
        if self.recording is not None:
            self.recording.forks += 1
        if self.sides:
            from numba import cuda
            fork = cuda.event(timing=False)
            fork.record(self.main)
            for side in self.sides:
                fork.wait(side)
            self.recording.held.append(fork)
        return self

    @contextlib.contextmanager
    def lane(self, n: int):
        """The backend's launches inside go to side stream n (when lanes are on)."""
        if not self.sides:
            yield
            return
        self.backend.stream = self.sides[n]
        try:
            yield
        finally:
            self.backend.stream = self.main

    def __exit__(self, kind, error, traceback):
        if self.sides:
            from numba import cuda
            for side in self.sides:
                joined = cuda.event(timing=False)
                joined.record(side)
                joined.wait(self.main)
                self.recording.held.append(joined)
        return False


class Graph:
    """A recorded round: `replay()` runs its launches again on the stream it was recorded on."""

    def __init__(self, stream, held, launches, captured=None, executable=None):
        self.stream, self.held, self.launches = stream, held, launches
        self.forks = 0  # sets of lanes recorded side by side
        self.kernels = 0  # kernel launches a replay runs
        self.overlapped = 0  # edges from a kernel to a kernel made programmatic (`overlap_launches`)
        self.executable = executable
        self.done = None  # an event recorded after each replay on the GPU, which `wait` waits for
        if executable is not None:
            from numba import cuda
            self.done = cuda.event(timing=False)
            weakref.finalize(self, _destroy, captured, executable)

    def replay(self) -> None:
        if self.executable is None:
            for kernel, configuration, arguments in self.launches:
                kernel[configuration](*arguments)
            return
        _check(cu.cuGraphLaunch(self.executable, cu.CUstream(int(self.stream.handle or 0))))
        self.done.record(self.stream)

    def wait(self) -> None:
        """Wait until the last replay has run (and nothing queued after it: a round replayed ahead runs on). The
        simulator's replay has run when it returns."""
        if self.done is not None:
            self.done.synchronize()


def _destroy(captured, executable) -> None:
    cu.cuGraphExecDestroy(executable)
    cu.cuGraphDestroy(captured)
