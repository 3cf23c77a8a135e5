"""Shared fixtures: small random checkpoints written by the project's own writer, once per session.

`--gpu` runs the kernel tests on a real GPU; without it, kernels run under numba's CUDA simulator. The choice must
be made before numba.cuda is first imported, so this file imports neither numba nor tensorfold at module level.
"""
import contextlib
import dataclasses
import os

import pytest


def pytest_addoption(parser):
    parser.addoption("--gpu", action="store_true", help="run kernel tests on the GPU instead of the simulator")


def pytest_configure(config):
    config.addinivalue_line("markers",
                            "gpu: needs a real GPU; runs only with --gpu (skipped, with its reason, without)")
    if not config.getoption("--gpu"):
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        return
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        raise pytest.UsageError("--gpu with NUMBA_ENABLE_CUDASIM=1: the kernels would run in the simulator")
    from numba import cuda
    if not cuda.is_available():
        raise pytest.UsageError("--gpu: no usable CUDA GPU here (numba.cuda.is_available() is False)")
    # pyproject's --dist loadfile keeps a file on one worker, for the simulator's models; on the GPU the contract's
    # checks at real shapes would then run one after another, so the tests are spread one by one instead.
    if getattr(config.option, "dist", "no") == "loadfile":
        config.option.dist = "load"


def pytest_collection_modifyitems(config, items):
    if config.getoption("--gpu"):
        return
    skip = pytest.mark.skip(reason="needs a real GPU: run with --gpu")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def cached_device_memory_returned(request):
    """Under --gpu, after each test: the blocks this worker's device memory pool keeps for reuse go back to the
    driver. The workers share one GPU, and what one worker's pool keeps the others cannot have."""
    yield
    if request.config.getoption("--gpu"):
        import gc

        from tensorfold.device import pool
        gc.collect()  # arrays held only by reference cycles go back to the pool first
        pool.release_cached()


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


# --- the lane-round tests (test_lanes.py, test_exactness.py, test_gpu_lanes.py): one model per session ------------
#
# Without --gpu they run on the twins with the tiny checkpoints; under --gpu on the GPU with a random checkpoint of
# Qwen3.5-0.8B's config, all 24 layers, in MLX 4-bit. TENSORFOLD_TEST_LANES=sim runs them on the `cuda` backend in
# numba's CUDA simulator instead of the twins: the GPU's code path (device arrays, every kernel) on any machine, at a
# micro config, slowly (about 10 s a forward: run a few tests with -k). TENSORFOLD_TEST_LANES=numpy (the default
# backend) also runs test_gpu_lanes.py without a GPU.

LANES_SWITCH = "TENSORFOLD_TEST_LANES"

# The public attributes of numba-cuda's DeviceNDArray. The simulator's device arrays wrap NumPy arrays and lend
# them every NumPy attribute (tobytes, astype, ...), which a GPU's device arrays lack.
DEVICE_ARRAY_ATTRIBUTES = frozenset({
    "shape", "strides", "dtype", "size", "ndim", "nbytes", "alloc_size", "flags", "stream", "gpu_data", "T",
    "transpose", "reshape", "ravel", "view", "squeeze", "split", "bind", "copy_to_host", "copy_to_device", "getitem",
    "setitem", "is_c_contiguous", "is_f_contiguous", "__array__", "__len__", "__cuda_array_interface__"})


def sim_lanes_config():
    """The lane tests' config in the simulator: the narrowest widths with both mixers, and a vocabulary that holds
    every id the tests draw (below 500)."""
    from tensorfold.model.tiny import TINY_CONFIG
    return dataclasses.replace(
        TINY_CONFIG, vocab_size=512, hidden_size=16, intermediate_size=16, num_hidden_layers=2, layer_types=(L, F),
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, linear_num_key_heads=1, linear_num_value_heads=2,
        linear_key_head_dim=4, linear_value_head_dim=4, tie_word_embeddings=True)


def graph_model_for(request, on_gpu, tmp_path_factory, name: str, seed: int):
    """A module's model on the `cuda` backend for the replay tests: the lane tests' model on the GPU; in the
    simulator the micro lanes config, whose time goes to the head's GEMV, at the smallest vocabulary the tiny
    tokenizer allows (263 ids)."""
    if on_gpu:
        return request.getfixturevalue("lanes_model")
    request.getfixturevalue("simulated_module")
    import tensorfold
    from tensorfold.model.tiny import make_tiny
    folder = str(tmp_path_factory.mktemp(name))
    make_tiny(folder, seed=seed, fmt="hf", config=dataclasses.replace(sim_lanes_config(), vocab_size=264))
    return tensorfold.load(folder, backend="cuda")


def twin_of(model):
    """The same checkpoint on the numpy backend: the eager reference of the replay tests. Every kernel gives its
    twin's bits (the contract; tests/test_backend_sim.py runs whole models), so a replay that equals the twins equals
    an eager round on its own backend, and the twins take a fraction of the simulator's time."""
    import tensorfold
    if model.path not in _twins:
        _twins[model.path] = tensorfold.load(model.path, backend="numpy")
    return _twins[model.path]


_twins = {}  # checkpoint folder -> its model on the numpy backend


@pytest.fixture(scope="session")
def lanes_backend(request, on_gpu):
    """The backend of the lane tests: "cuda" under --gpu; without it "numpy", or with TENSORFOLD_TEST_LANES=sim
    "cuda" in the simulator (set up by simulated_device)."""
    mode = os.environ.get(LANES_SWITCH, "numpy")
    if mode not in ("numpy", "sim"):
        raise ValueError(f"{LANES_SWITCH}={mode!r}: use numpy or sim")
    if on_gpu:
        return "cuda"
    if mode == "sim":
        request.getfixturevalue("simulated_device")
        return "cuda"
    return "numpy"


@pytest.fixture(scope="session")
def simulated_device():
    """The simulator set up for the whole session's model tests (see `simulator_for_models`)."""
    with simulator_for_models():
        yield


@pytest.fixture(scope="module")
def simulated_module():
    """The simulator set up for one module's model tests, undone at its end so that later modules see the
    defaults (`simulator_for_models`)."""
    with simulator_for_models():
        yield


@contextlib.contextmanager
def simulator_for_models():
    """The simulator set up for whole-model tests: 8 threads an output for the GEMV and 8-thread norm blocks (as in
    test_backend_sim.py), and device arrays that refuse what a GPU's refuse (so a test that forgets to_host fails here
    as it would on a GPU).

    Each simulated thread runs the kernel's Python code of its own, so two sizes shrink with them: `walk_x` lays x out
    in rounds of 8 * CHUNK positions (the walk's round at 8 threads, not 256 positions), and the one-thread-per-element
    kernels take blocks of 64. Neither changes a value: the walk's order follows THREADS, the element kernels bound
    their index by the size. A two-stream decode round of the micro model then runs 4,528 simulated threads instead of
    9,520, and the graph tests' two controls took 14 % less time."""
    import numpy as np
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    from tensorfold.cuda import attention, conv, elementwise, gemv, rmsnorm, rope
    from tensorfold.device import grid as common
    lend_attribute, index = FakeCUDAArray.__getattr__, FakeCUDAArray.__getitem__

    def device_attribute(array, name):
        if name not in DEVICE_ARRAY_ATTRIBUTES:
            raise AttributeError(f"a device array has no attribute {name!r}: copy it to the host first")
        return lend_attribute(array, name)

    def device_index(array, key):
        parts = key if isinstance(key, tuple) else (key,)
        if not all(isinstance(p, (int, np.integer, slice)) or p is Ellipsis for p in parts):
            raise TypeError(f"a device array takes integers and slices as indices, not {key!r}")
        return index(array, key)

    with pytest.MonkeyPatch.context() as patch:
        threads = 8
        patch.setattr(gemv, "THREADS", threads)
        patch.setattr(gemv, "ROUND", threads * gemv.CHUNK)  # walk_x's rounds follow the walk's
        patch.setattr(gemv, "ROUND_PAIRS", threads * gemv.CHUNK // 2)
        patch.setattr(rmsnorm, "THREADS", threads)
        for module in (attention, common, conv, elementwise, gemv, rope):  # each holds BLOCK as its own name
            patch.setattr(module, "BLOCK", 64)
        patch.setattr(FakeCUDAArray, "__getattr__", device_attribute)
        patch.setattr(FakeCUDAArray, "__getitem__", device_index)
        yield


@pytest.fixture(scope="session")
def lanes_model(request, lanes_backend, on_gpu, tmp_path_factory):
    """The model of the lane tests: the tiny "gqa" checkpoint on the twins; under --gpu a random checkpoint with
    Qwen3.5-0.8B's config (its max_position_embeddings, 262,144, leaves room for a stream of more than 8,192 keys)
    in MLX 4-bit; in the simulator the micro config in bf16 (narrower than one quantization group)."""
    import tensorfold
    from tensorfold.model.tiny import make_tiny
    if lanes_backend == "numpy":
        return tensorfold.load(request.getfixturevalue("tiny_hf"), backend="numpy")
    folder = str(tmp_path_factory.mktemp("lanes"))
    if on_gpu:  # random 4-bit codes drawn packed: seconds, where quantizing 0.8B float weights takes a minute
        from tensorfold.cli.bench.checkpoint import write_random_mlx4
        from tensorfold.model.presets import preset
        write_random_mlx4(folder, preset("0.8B"), seed=1)
    else:
        make_tiny(folder, seed=1, fmt="hf", config=sim_lanes_config())
    return tensorfold.load(folder, backend="cuda")


@pytest.fixture(scope="session")
def lanes_mlx4_model(request, lanes_backend):
    """The lane tests' MLX 4-bit model: the tiny one on the twins; on the `cuda` backend lanes_model itself (MLX 4-bit
    on the GPU, bf16 in the simulator)."""
    if lanes_backend == "numpy":
        import tensorfold
        return tensorfold.load(request.getfixturevalue("tiny_mlx4"), backend="numpy")
    return request.getfixturevalue("lanes_model")
