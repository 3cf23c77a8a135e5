"""The `cuda` backend end to end under numba's CUDA simulator: the whole model through the kernels.

The simulator runs each GPU thread as Python code of its own, so this uses a micro model and narrows the GEMV to 8
threads an output and the norm blocks to 8 threads (twins and kernels read the same module constants, so they
still compare exactly). The real widths are checked kernel by kernel in test_contract.py, and end to end on a GPU in test_gpu.py.
"""
import dataclasses

import numpy as np
import pytest

import tensorfold
from tensorfold.cuda import gemv, rmsnorm
from tensorfold.model.tiny import TINY_CONFIG, make_tiny

L, F = "linear_attention", "full_attention"
MICRO = dataclasses.replace(
    TINY_CONFIG, vocab_size=300, hidden_size=16, intermediate_size=16, num_hidden_layers=2, layer_types=(L, F),
    num_attention_heads=2, num_key_value_heads=1, head_dim=8, linear_num_key_heads=1, linear_num_value_heads=2,
    linear_key_head_dim=4, linear_value_head_dim=4, tie_word_embeddings=True)


@pytest.fixture
def micro(tmp_path, monkeypatch, on_gpu):
    if on_gpu:
        pytest.skip("under --gpu, test_gpu.py runs whole models on the GPU at real widths")
    monkeypatch.setattr(gemv, "THREADS", 8)
    monkeypatch.setattr(rmsnorm, "THREADS", 8)
    make_tiny(tmp_path, seed=0, config=MICRO)
    return str(tmp_path)


def test_cuda_backend_equals_numpy_in_the_simulator(micro):
    cpu = tensorfold.load(micro, backend="numpy")
    sim = tensorfold.load(micro, backend="cuda")
    assert sim.backend.name == "cuda"
    ids = [5, 17, 42, 7]
    expected = cpu.logits(ids)
    assert sim.logits(ids).tobytes() == expected.tobytes()
    state = sim.net.new_state()
    steps = [sim.backend.to_host(sim.net.forward(ids[:3], state)), sim.backend.to_host(sim.net.forward(ids[3:], state))]
    assert np.concatenate(steps).tobytes() == expected.tobytes()


def test_device_draws_equal_the_twin_when_their_slots_are_reused(on_gpu):
    """`CudaBackend.sample_rows` writes each call's parameters into the same mapped slots for a row count: two calls
    with different parameters each equal the twin (control: the two calls' tokens differ, so a second call that read
    the first's parameters would be caught)."""
    from tensorfold.backends.cuda_backend import CudaBackend
    from tensorfold.cuda import sampling
    backend, rng = CudaBackend(), np.random.default_rng(3)
    logits = rng.standard_normal((3, 64)).astype(np.float32)
    drawn = []
    for seed, temperature in ((11, 0.9), (12, 0.0)):
        rows = dict(seeds=np.full(3, seed, np.uint64), positions=np.arange(3, dtype=np.uint64),
                    temperature=np.full(3, temperature, np.float32), top_k=np.array([0, 5, 0], np.int32),
                    top_p=np.array([1.0, 1.0, 0.9], np.float32), min_p=np.zeros(3, np.float32))
        tokens = backend.sample_rows(backend.upload(logits), *rows.values())
        assert tokens.tolist() == sampling.sample_rows(logits, *rows.values()).tolist()
        drawn.append(tokens.tolist())
    assert drawn[0] != drawn[1]
