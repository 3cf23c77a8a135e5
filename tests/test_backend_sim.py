"""The `cuda` backend end to end under numba's CUDA simulator: the whole model through the kernels.

The simulator runs each GPU thread as a Python thread, so this uses a micro model and narrows the GEMV to 8
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
