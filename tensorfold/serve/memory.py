"""The server's memory plan: what the weights and the streams' caches take, beside the memory free where the caches
live. A check at startup, not a reservation: the caches grow as their streams do, never past the engine's context."""
import dataclasses
import gc
import os

from tensorfold.device import SIMULATED


def on_gpu(backend) -> bool:
    """Whether the backend's arrays live in a GPU's memory: the cuda backend outside numba's simulator."""
    return backend.can_record and not SIMULATED


def free_bytes(backend) -> int:
    """Free memory where the caches live: the GPU's, once the frees numba defers have run, or the host's."""
    if on_gpu(backend):
        gc.collect()
        context = backend.cuda.current_context()
        context.deallocations.clear()
        return context.get_memory_info().free
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


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
