"""Kernel launches with less host work: numba's dispatcher, minus what a decode round repeats hundreds of times.

`kernel[grid, block, stream](*args)` on a numba dispatcher derives the numba type of every argument (for a device
array: a new `types.Array`, interned through numba's type system), looks the compiled kernel up by those types, then
marshals each argument through a general path. Repeated for each of a decode round's hundreds of launches, that
host work, not the GPU, sets the round's time.

`CachedLaunch` wraps a `@cuda.jit` kernel and keeps, per argument layout (an array's dtype, rank and contiguity;
a scalar's Python type), the compiled kernel and one small packing function per argument. The first launch with a
layout goes through numba (which compiles); later ones pack the arguments as numba's `_prepare_args` does for
device arrays and scalars (for an array: meminfo 0, parent 0, size, itemsize, data pointer, shape, strides in bytes)
and call the same `cuda.core.launch`. The kernels, their arguments and their order on the stream are unchanged:
only the host's bookkeeping is cached. Under numba's CUDA simulator, or with TENSORFOLD_CACHED_LAUNCH=0, every
launch takes numba's path.

Anything else (a host NumPy array handed to a kernel, an argument type seen for the first time) takes numba's path.

Every launch also reports to an open CUDA graph recording (graphs.py), which keeps its arguments alive, and in the
simulator records the launch instead of running it.

With overlapped launches (graphs.OVERLAP: on a GPU of compute capability 9.0 on, unless TENSORFOLD_OVERLAP=0) every
kernel first waits for the kernels before it (`waiting`, `inputs_ready`), so that a recorded graph may launch it before
they have finished (graphs.py, "overlapped launches"). Off, the kernels are compiled as written.

A kernel made with `kernel_waiting_inside` places that wait itself (`wait_for_inputs`): it may first load what no
kernel writes, its weights, so that those loads are in flight while the kernel before it finishes; every thread
waits before it reads anything else and before it writes. A kernel that calls `let_next_launch` lets the next one
launch while it runs, which gains only where that one has such loads to do (x's quantize, before a round's GEMM):
blocks that only wait would hold multiprocessors the running kernel needs. Off, both are nothing.
"""
import ctypes
import functools
import inspect
import os

from numba import cuda

from tensorfold.device import SIMULATED, graphs

if not SIMULATED:
    import cuda.core as core  # the launch API numba's dispatcher calls
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.cudadrv import driver
    from numba.cuda.extending import intrinsic

    @intrinsic
    def inputs_ready(typingctx):
        """Wait until the kernels this one depends on have completed and their writes are visible (PTX
        `griddepcontrol.wait`, compute capability 9.0; the `memory` clobber keeps every access after it). Outside a
        graph whose edges are programmatic it returns at once."""
        def codegen(context, builder, signature, args):
            wait = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), "griddepcontrol.wait;", "~{memory}",
                                side_effect=True)
            builder.call(wait, ())
        return types.void(), codegen

    @intrinsic
    def next_may_launch(typingctx):
        """Let the kernel after this one launch before this one has finished, once every block of this one has
        called it (PTX `griddepcontrol.launch_dependents`, compute capability 9.0); that kernel still waits in
        `inputs_ready` for this one's completion. Outside a graph whose edges are programmatic it does nothing."""
        def codegen(context, builder, signature, args):
            launch = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), "griddepcontrol.launch_dependents;", "",
                                  side_effect=True)
            builder.call(launch, ())
        return types.void(), codegen
else:
    @cuda.jit(device=True)
    def inputs_ready():
        """The simulator's form: the kernel before has finished (it runs one kernel at a time)."""


@cuda.jit(device=True)
def no_wait():
    """What `wait_for_inputs` and `let_next_launch` are where kernels are compiled as written: nothing."""


if graphs.OVERLAP and not SIMULATED:
    wait_for_inputs, let_next_launch = inputs_ready, next_may_launch
else:
    wait_for_inputs, let_next_launch = no_wait, no_wait


def array_layout(array):
    """numba's layout letter of a device array: 'C', 'F', or 'A' (neither, or broadcast with a zero stride)."""
    if 0 in array.strides and array.size:
        return "A"
    flags = array.flags
    return "C" if flags["C_CONTIGUOUS"] else "F" if flags["F_CONTIGUOUS"] else "A"


def layout_key(value):
    """What decides the compiled kernel an argument selects, or None for an argument the fast path does not take."""
    if hasattr(value, "gpu_data"):  # a numba device array
        return value.dtype.str, value.ndim, array_layout(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int, value >= 1 << 63  # numba types a Python int as int64, or uint64 past int64's range
    if isinstance(value, (bool, float)) or getattr(value, "shape", None) == ():  # NumPy scalars have shape ()
        return type(value)
    return None


def packer(numba_type):
    """The function that turns one argument of `numba_type` into the kernel parameters numba would pass."""
    from numba.cuda import types
    if isinstance(numba_type, types.Array):
        def pack_array(array):
            pointer = array.device_ctypes_pointer.value or 0
            return (0, 0, array.size, array.dtype.itemsize, pointer) + tuple(array.shape) + tuple(array.strides)
        return pack_array
    if isinstance(numba_type, types.Integer):
        c_type = getattr(ctypes, f"c_{numba_type}")
        return lambda value: (c_type(value),)
    if numba_type == types.float32:
        return lambda value: (ctypes.c_float(value),)
    if numba_type == types.float64:
        return lambda value: (ctypes.c_double(value),)
    if numba_type == types.boolean:
        return lambda value: (value,)
    return None


class CachedLaunch:
    """A `@cuda.jit` kernel launched through a per-layout cache (see the module's docstring), or always through
    numba when not `cached`."""

    def __init__(self, dispatcher, cached=True, waits=False, py_func=None):
        self.dispatcher, self.cached, self.waits = dispatcher, cached, waits  # waits: behind `inputs_ready`
        self.py_func = py_func or dispatcher.py_func  # the kernel as written: the twins call its device functions
        self.compiled = {}  # layout keys -> (cuda.core kernel, argument packers)
        functools.update_wrapper(self, self.py_func)

    def __getitem__(self, config):
        grid, block, stream, shared = (tuple(config) + (0, 0))[:4]
        return functools.partial(self.launch, grid, block, stream, shared)

    def launch(self, grid, block, stream, shared, *args):
        recording = graphs.recording()
        if recording is not None and recording.take(self.dispatcher, (grid, block, stream, shared), args, self.waits):
            return
        if not self.cached:
            self.dispatcher[grid, block, stream, shared](*args)
            return
        keys = tuple(layout_key(a) for a in args)
        entry = self.compiled.get(keys) if None not in keys else None
        if entry is None:
            self.dispatcher[grid, block, stream, shared](*args)  # compiles if need be, and launches
            self.remember(keys, args)
            return
        kernel, packers = entry
        parameters = [p for pack, value in zip(packers, args) for p in pack(value)]
        core.launch(driver._to_core_stream(stream), core.LaunchConfig(grid=grid, block=block, shmem_size=shared),
                    kernel, *parameters)

    def remember(self, keys, args) -> None:
        """Cache the compiled kernel numba picked for these argument layouts, when every argument can be packed."""
        if None in keys:
            return
        signature = tuple(self.dispatcher.typeof_pyval(a) for a in args)
        compiled = self.dispatcher.overloads.get(signature)
        if compiled is None or compiled.debug:
            return
        packers = [packer(t) for t in compiled.argument_types]
        if None not in packers:
            self.compiled[keys] = (compiled._codelibrary.get_cufunc().kernel, packers)

    def __getattr__(self, name):  # everything else (overloads, inspect_*, ...) is the dispatcher's
        return getattr(self.dispatcher, name)


def waiting(function):
    """The kernel `function` behind `inputs_ready()`: a function of the same parameters that waits, then runs
    `function` as a device function (which the compiler inlines). Written out as source because a kernel's
    parameters must be named: numba takes no `*args` in a kernel."""
    body = cuda.jit(device=True)(function)
    names = ", ".join(inspect.signature(function).parameters)
    namespace = {"inputs_ready": inputs_ready, "body": body}
    exec(f"def {function.__name__}({names}):\n    inputs_ready()\n    body({names})\n", namespace)
    return namespace[function.__name__]


def launches_cached() -> bool:
    """Whether kernels launch through CachedLaunch's cache: on a GPU, unless TENSORFOLD_CACHED_LAUNCH=0."""
    return not SIMULATED and os.environ.get("TENSORFOLD_CACHED_LAUNCH", "1") != "0"


def kernel(function):
    """`@cuda.jit` for a kernel, launched through CachedLaunch: cached on a GPU; through numba's own dispatcher under
    the simulator or with TENSORFOLD_CACHED_LAUNCH=0 (the switch that measures what the cache saves). With
    graphs.OVERLAP the kernel first waits for the kernels before it (`waiting`)."""
    cached = launches_cached()
    if not graphs.OVERLAP:
        return CachedLaunch(cuda.jit(function), cached)
    return CachedLaunch(cuda.jit(waiting(function)), cached, waits=True, py_func=function)


def kernel_waiting_inside(function):
    """`kernel` for a kernel that calls `wait_for_inputs()` itself (see the module's docstring), every thread of it,
    before it reads what another kernel writes and before it writes."""
    return CachedLaunch(cuda.jit(function), launches_cached(), waits=wait_for_inputs is not no_wait)
