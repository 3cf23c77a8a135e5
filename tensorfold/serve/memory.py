"""The server's memory plan: what the weights and the streams' caches take, beside the memory free where the caches
live. A check at startup, not a reservation: the caches grow as their streams do, never past the engine's context."""
import dataclasses
import gc
import os

from tensorfold.device import SIMULATED


def on_gpu(backend) -> bool:
    """Whether the backend's arrays live in a GPU's memory: the cuda backend outside numba's simulator."""
    return backend.on_device and not SIMULATED


def available_host_bytes(meminfo: str = "/proc/meminfo") -> int:
    """The host memory a process can take without swapping: MemAvailable (page cache it can reclaim included),
    else, where /proc/meminfo lacks it, the free pages."""
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the kernel writes it in kB
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def free_bytes(backend) -> int:
    """Free memory where the caches live: the GPU's, once the frees numba defers have run, or the host's."""
    if on_gpu(backend):
        gc.collect()
        context = backend.cuda.current_context()
        context.deallocations.clear()
        return context.get_memory_info().free
    return available_host_bytes()


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """An engine's memory when every lane holds its full context, beside the memory free now."""
    weights: int  # bytes the model's weights take (already loaded, so outside `free`)
    stream: int  # bytes one stream's cache takes (Engine.stream_bytes)
    streams: int  # lanes (Engine.parallel)
    free: int  # free bytes where the caches live

    @classmethod
    def of(cls, engine) -> "MemoryPlan":
        return cls(engine.model.weight_bytes, engine.stream_bytes(), engine.parallel, free_bytes(engine.model.backend))

    @property
    def caches(self) -> int:
        return self.stream * self.streams

    @property
    def fits(self) -> bool:
        return self.caches <= self.free
