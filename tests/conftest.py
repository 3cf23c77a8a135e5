"""Shared fixtures: small random checkpoints written by the project's own writer, once per session.

`--gpu` runs the kernel tests on a real GPU; without it, kernels run under numba's CUDA simulator. The choice must
be made before numba.cuda is first imported, so this file imports neither numba nor tensorfold at module level.
"""
import dataclasses
import os

import pytest


def pytest_addoption(parser):
    parser.addoption("--gpu", action="store_true", help="run kernel tests on the GPU instead of the simulator")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a real GPU; runs only with --gpu (skipped, with its reason, without)")
    if not config.getoption("--gpu"):
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        return
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        raise pytest.UsageError("--gpu with NUMBA_ENABLE_CUDASIM=1: the kernels would run in the simulator")
    from numba import cuda
    if not cuda.is_available():
        raise pytest.UsageError("--gpu: no usable CUDA GPU here (numba.cuda.is_available() is False)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--gpu"):
        return
    skip = pytest.mark.skip(reason="needs a real GPU: run with --gpu")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def on_gpu(request):
    """True under --gpu (kernels on the GPU at real shapes), False in the simulator (tiny shapes)."""
    return request.config.getoption("--gpu")


L, F = "linear_attention", "full_attention"


def tiny_configs():
    """Three shapes that between them cover every feature the reference tests must see."""
    from tensorfold.model.tiny import TINY_CONFIG
    return {
        # GQA 4/2 in attention, nv 4 > nk 2 in DeltaNet, rotary 0.25, untied.
        "gqa": TINY_CONFIG,
        # Tied, rotary 0.5, dk != dv, an irregular layer order starting with attention, one KV head.
        "tied": dataclasses.replace(
            TINY_CONFIG, tie_word_embeddings=True, partial_rotary_factor=0.5, num_hidden_layers=5,
            layer_types=(F, L, F, L, L), num_key_value_heads=1, linear_num_key_heads=1, linear_num_value_heads=2,
            linear_key_head_dim=16, linear_value_head_dim=32),
        # Wider heads, no attention GQA, nv 6 > nk 2, dk 32 != dv 16, six layers.
        "wide": dataclasses.replace(
            TINY_CONFIG, hidden_size=128, intermediate_size=192, num_hidden_layers=6,
            layer_types=(L, F, L, L, F, L), num_attention_heads=2, num_key_value_heads=2, head_dim=64,
            linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=32, linear_value_head_dim=16),
    }


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """name -> folder of a bf16 HF checkpoint for each tiny config."""
    from tensorfold.model.tiny import make_tiny
    folders = {}
    for seed, (name, config) in enumerate(tiny_configs().items()):
        folders[name] = str(tmp_path_factory.mktemp(name))
        make_tiny(folders[name], seed=seed, fmt="hf", config=config)
    return folders


@pytest.fixture(scope="session")
def tiny_hf(checkpoints):
    return checkpoints["gqa"]


@pytest.fixture(scope="session")
def tiny_mlx4(tmp_path_factory):
    from tensorfold.model.tiny import make_tiny
    folder = str(tmp_path_factory.mktemp("mlx4"))
    make_tiny(folder, seed=7, fmt="mlx4")
    return folder
