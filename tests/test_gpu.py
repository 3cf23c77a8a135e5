"""End to end on the GPU: the model on the `cuda` backend gives the same logits bytes as on `numpy`.

Runs only with `pytest --gpu` (the simulator is far too slow for whole models; CI checks each kernel against its
twin under the simulator instead, in test_contract.py).
"""
import numpy as np
import pytest

import tensorfold

pytestmark = pytest.mark.gpu


def stepwise(model, ids, chunks):
    state, out, start = model.net.new_state(), [], 0
    for size in chunks:
        out.append(model.backend.to_host(model.net.forward(ids[start:start + size], state)))
        start += size
    return np.concatenate(out)


@pytest.mark.parametrize("name", ["gqa", "tied", "wide"])
def test_tiny_checkpoints_cuda_equals_numpy(checkpoints, name):
    cpu = tensorfold.load(checkpoints[name], backend="numpy")
    gpu = tensorfold.load(checkpoints[name], backend="cuda")
    ids = np.random.default_rng(2).integers(0, cpu.config.vocab_size, 300)
    expected = cpu.logits(ids)
    assert gpu.logits(ids).tobytes() == expected.tobytes()
    assert stepwise(gpu, ids, [130, 1, 1, 168]).tobytes() == expected.tobytes()


def test_embedded_model_cuda_equals_numpy():
    from tensorfold.models import DEFAULT_MODEL
    cpu = tensorfold.load(DEFAULT_MODEL, backend="numpy")
    gpu = tensorfold.load(DEFAULT_MODEL, backend="cuda")
    ids = cpu.tokenizer.encode("ROMEO:\nBut, soft! what light through yonder window breaks?\n")
    assert gpu.logits(ids).tobytes() == cpu.logits(ids).tobytes()
    assert gpu.generate(ids, 24, temperature=0.8, seed=3) == cpu.generate(ids, 24, temperature=0.8, seed=3)


def test_qwen35_08b_shapes_in_mlx4_cuda_equals_numpy(tmp_path_factory):
    """A random checkpoint with Qwen3.5-0.8B's exact config in MLX 4-bit, written on this machine."""
    from tensorfold.model.presets import preset
    from tensorfold.model.tiny import make_tiny
    folder = tmp_path_factory.mktemp("qwen35-0.8b-mlx4")
    make_tiny(folder, seed=0, fmt="mlx4", config=preset("0.8B"))
    cpu = tensorfold.load(str(folder), backend="numpy")
    gpu = tensorfold.load(str(folder), backend="cuda")
    ids = np.random.default_rng(3).integers(0, 248000, 9)
    assert gpu.logits(ids).tobytes() == cpu.logits(ids).tobytes()


POOL_CHECK = """
import sys
from tensorfold.backends import CudaBackend
from tensorfold.device.pool import release_cached, size_class
backend = CudaBackend()
manager = backend.cuda.current_context().memory_manager
print(backend.pooled, type(manager).__name__)
if backend.pooled:
    first = backend.zeros((1000,))
    where = first.device_ctypes_pointer.value
    del first
    again = backend.zeros((1000,))
    assert again.device_ctypes_pointer.value == where, "a freed block of the same class is handed out again"
    held = manager.held
    for _ in range(200):  # a round's worth of short-lived arrays, many times: nothing new from the driver
        arrays = [backend.zeros((n,)) for n in (10, 1000, 5000, 70000)]
        del arrays
    assert manager.held == held + sum(size_class(4 * n) for n in (10, 1000, 5000, 70000)), manager.held - held
    before = manager.held
    kept = backend.zeros((1000,))  # takes a cached block: a live array's block stays with it
    returned = release_cached()  # every cached block back to the driver
    assert not any(manager.free.values()) and returned == before - manager.held > 0, (returned, manager.held)
    assert returned >= sum(size_class(4 * n) for n in (10, 5000, 70000)), returned
    assert (kept.copy_to_host() == 0).all()
"""


@pytest.mark.parametrize("switch, pooled", [("1", "True CachingMemoryManager"), ("0", "False NumbaCUDAMemoryManager")])
def test_device_pool_reuses_blocks_and_has_a_switch(switch, pooled):
    """A fresh process (the pool must come before the CUDA context): freed blocks come back, repeated rounds take
    nothing more from the driver, `release_cached` returns the cached blocks; TENSORFOLD_DEVICE_POOL=0 leaves
    numba's manager (the control: it is a real switch, so the first case's checks ran on the pool)."""
    import os
    import subprocess
    import sys
    result = subprocess.run([sys.executable, "-c", POOL_CHECK], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TENSORFOLD_DEVICE_POOL": switch})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == pooled
