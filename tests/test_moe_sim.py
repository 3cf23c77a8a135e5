"""The MoE block on the `cuda` backend in numba's CUDA simulator, against the twins: a micro MoE model whose routed
experts are MLX 4-bit (groups of 32) and whose other weights are bf16 (the dense layers' kernels have tests of their
own, and the exact GEMM's tensor-core emulation is the simulator's slowest kernel): a prompt's logits, and two
streams' prompts in one round followed by a decode round recorded as a CUDA graph and replayed (the routed experts
read their experts on the device, so nothing in the block copies to the host)."""
import dataclasses

import numpy as np
import pytest

import tensorfold
from tensorfold.api import Model
from tensorfold.backends import make_backend
from tensorfold.engine import Engine, SamplingParams
from tensorfold.errors import BackendError
from tensorfold.model.checkpoint import Linear, load_weights
from tensorfold.model.config import ModelConfig
from tensorfold.model.tiny import TINY_MOE_CONFIG, make_tiny, random_tensors
from tensorfold.model.tokenizer import Tokenizer
from tensorfold.model.writer import write_checkpoint
from tensorfold.numerics.formats import f32_to_bf16

L, F = "linear_attention", "full_attention"
MICRO_MOE = dataclasses.replace(
    TINY_MOE_CONFIG, hidden_size=32, num_hidden_layers=2, layer_types=(L, F), num_attention_heads=2,
    num_key_value_heads=1, head_dim=8, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=4,
    linear_value_head_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
    shared_expert_intermediate_size=32, tie_word_embeddings=True)


@pytest.fixture(scope="module")
def folders(request, tmp_path_factory, on_gpu):
    """The micro model in bf16 and in MLX 4-bit. Without --gpu the module's tests run in the simulator; with it, on
    the GPU at these micro widths."""
    if not on_gpu:
        request.getfixturevalue("simulated_module")
    hf = str(tmp_path_factory.mktemp("micro_moe_hf"))
    config = make_tiny(hf, seed=31, fmt="hf", config=MICRO_MOE)
    mlx = str(tmp_path_factory.mktemp("micro_moe_mlx4"))
    write_checkpoint(mlx, config, random_tensors(config, 31), "mlx4", group_size=32, tokenizer_from=hf)
    return hf, mlx


def experts_only_affine(weights: dict) -> dict:
    """The weights with every affine Linear but the expert stacks turned into bf16 (its dequantized values)."""
    return {name: Linear("bf16", w.out_features, w.in_features, f32_to_bf16(w.dense()))
            if isinstance(w, Linear) and w.kind == "affine" and ".experts." not in name else w
            for name, w in weights.items()}


@pytest.fixture(scope="module")
def models(folders):
    config = ModelConfig.from_file(folders[1])
    weights = experts_only_affine(load_weights(folders[1], config))
    return tuple(Model(folders[1], config, weights, Tokenizer.from_folder(folders[1]), make_backend(name))
                 for name in ("numpy", "cuda"))


def test_moe_logits_on_the_simulator_equal_the_twins(models):
    twins, kernels = models
    ids = np.random.default_rng(0).integers(0, MICRO_MOE.vocab_size, 4)
    assert twins.logits(ids).tobytes() == kernels.logits(ids).tobytes()


def test_moe_decode_round_recorded_as_a_graph_equals_the_twins(models):
    """Two streams' prompts in one round, then a decode round of both, recorded and replayed (the first decode
    round of a set of streams is recorded, then run from its recording)."""
    twins, kernels = models
    prompts, params = [[5, 9, 11], [7, 3]], SamplingParams(max_tokens=2, stop_ids=())
    outputs = []
    for model, graphs in ((twins, False), (kernels, True)):
        engine = Engine(model, parallel=2, graphs=graphs, ahead=graphs)
        requests = [engine.submit(p, params) for p in prompts]
        while engine.run_round():
            pass
        # the decode round, and the round replayed ahead of its tokens (its rows computed, never kept)
        assert not graphs or (engine.graphs.recorded, engine.graphs.replayed) == (2, 2)
        outputs.append([r.output for r in requests])
    assert outputs[0] == outputs[1]


def test_the_shared_expert_folded_into_the_grouped_kernels_equals_the_twins(folders):
    """Every Linear MLX 4-bit: the shared expert has the experts' form and width, so it is the grouped kernels'
    last expert (model/moe.py). A prompt's logits, and a decode round recorded and replayed, equal the twins'."""
    config = ModelConfig.from_file(folders[1])
    twins, kernels = (Model(folders[1], config, load_weights(folders[1], config), Tokenizer.from_folder(folders[1]),
                            make_backend(name)) for name in ("numpy", "cuda"))
    assert kernels.net.experts["layers.0.mlp."].shared and twins.net.experts["layers.0.mlp."].shared
    ids = [5, 9]
    assert twins.logits(ids).tobytes() == kernels.logits(ids).tobytes()
    outputs = []
    for model, graphs in ((twins, False), (kernels, True)):
        engine = Engine(model, parallel=1, graphs=graphs)
        request = engine.submit(ids, SamplingParams(max_tokens=2, stop_ids=()))
        while engine.run_round():
            pass
        assert not graphs or engine.graphs.replayed >= 1
        outputs.append(request.output)
    assert outputs[0] == outputs[1]


def test_float_experts_on_the_cuda_backend_are_refused_by_name(folders):
    model = tensorfold.load(folders[0], backend="cuda")
    with pytest.raises(BackendError, match="routed experts stored as bf16"):
        model.logits([1, 2])


def test_the_router_kernel_holds_every_expert_count_a_config_allows():
    """route_launch refuses rows of more than cuda.moe.MAX_EXPERTS experts (a router block's shared array holds
    them): a config may not ask for more (model/config.py refuses num_experts above its own MAX_EXPERTS)."""
    from tensorfold.cuda import moe
    from tensorfold.model import config
    assert config.MAX_EXPERTS <= moe.MAX_EXPERTS
