"""A norm whose output an exact GEMM reads next quantizes it in its own launch (tensorfold/cuda/rmsnorm.py), and the
GEMM then takes no quantize launch of its own. The contract's "... with digits" checks compare those kernels' digits
with the twins'; these tests check, on micro MLX 4-bit models (one dense, one MoE whose router is 8-bit), that a
forward takes them (so that a model that never named its readers could not pass unseen) and that its logits keep the
numpy backend's bits. The control: the same forward with no readers named takes a quantize launch before every GEMM,
and the same logits."""
import collections
import dataclasses

import numpy as np
import pytest
from numba import cuda

import tensorfold
from tensorfold.cuda import gemm_launch, rmsnorm
from tensorfold.cuda.quantize import quantized_for
from tensorfold.device.launch import CachedLaunch
from tensorfold.model.checkpoint import Linear
from tensorfold.model.qwen35 import Qwen35
from tensorfold.model.tiny import TINY_CONFIG, TINY_MOE_CONFIG, make_tiny, random_tensors
from tensorfold.model.writer import write_checkpoint

L, F = "linear_attention", "full_attention"
# every width a whole number of groups of 32, the DeltaNet's value heads included (the gated norm's blocks)
MICRO = dataclasses.replace(
    TINY_CONFIG, vocab_size=300, hidden_size=64, intermediate_size=64, num_hidden_layers=2, layer_types=(L, F),
    num_attention_heads=2, num_key_value_heads=1, head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2,
    linear_key_head_dim=32, linear_value_head_dim=32, tie_word_embeddings=True)
# its MLX file's router and shared-expert gate are 8-bit, as mlx-lm writes them, and its experts 4-bit
MICRO_MOE = dataclasses.replace(
    TINY_MOE_CONFIG, hidden_size=64, num_hidden_layers=2, layer_types=(L, F), num_attention_heads=2,
    num_key_value_heads=1, head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=32,
    linear_value_head_dim=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
    shared_expert_intermediate_size=32, tie_word_embeddings=True)
IDS = [5, 17, 42]


def micro_mlx4(request, tmp_path_factory, on_gpu, config, name):
    if not on_gpu:
        request.getfixturevalue("simulated_module")
    hf, mlx = (str(tmp_path_factory.mktemp(name + suffix)) for suffix in ("_hf", "_mlx4"))
    config = make_tiny(hf, seed=3, fmt="hf", config=config)
    write_checkpoint(mlx, config, random_tensors(config, 3), "mlx4", group_size=32, tokenizer_from=hf)
    return mlx


@pytest.fixture(scope="module")
def folder(request, tmp_path_factory, on_gpu):
    return micro_mlx4(request, tmp_path_factory, on_gpu, MICRO, "micro")


@pytest.fixture(scope="module")
def moe_folder(request, tmp_path_factory, on_gpu):
    return micro_mlx4(request, tmp_path_factory, on_gpu, MICRO_MOE, "micro_moe")


@pytest.fixture
def launched(monkeypatch):
    """The names of the kernels launched (every kernel launches through CachedLaunch), counted."""
    names, launch = collections.Counter(), CachedLaunch.launch

    def recorded(self, *args):
        names[self.__name__] += 1
        return launch(self, *args)
    monkeypatch.setattr(CachedLaunch, "launch", recorded)
    return names


def gemms(names) -> int:
    return sum(count for name, count in names.items() if name.endswith("gemm") or name.startswith("gemm"))


def test_norms_quantize_for_the_gemms_that_read_them(folder, launched):
    expected = tensorfold.load(folder, backend="numpy").logits(IDS)
    model = tensorfold.load(folder, backend="cuda")
    launched.clear()
    assert model.logits(IDS).tobytes() == expected.tobytes()
    # the first norm and the head's, a residual norm before each mixer but the first and before each MLP, the
    # DeltaNet's gated norm: each writes its digits; only o_proj's and each down_proj's input is quantized alone
    assert launched["rmsnorm_digits"] == 2 and launched["add_rmsnorm_digits"] == 3
    assert launched["rmsnorm_gated_digits"] == 1
    assert launched["quantize"] == 3 and gemms(launched) > 3


def test_control_no_readers_named_quantizes_before_every_gemm(folder, launched, monkeypatch):
    expected = tensorfold.load(folder, backend="numpy").logits(IDS)
    model = tensorfold.load(folder, backend="cuda")
    monkeypatch.setattr(Qwen35, "readers", lambda self, part, i=0: ())
    launched.clear()
    logits = model.logits(IDS)
    assert not any(name.endswith("_digits") for name in launched), launched
    assert launched["quantize"] == gemms(launched) and logits.tobytes() == expected.tobytes()


def test_an_moe_norm_quantizes_for_its_8_bit_router_and_4_bit_experts(moe_folder, launched):
    """The norm before a sparse block writes both layouts, so neither the router's GEMM nor the grouped gate/up
    quantizes x; what is left: o_proj's input, and each layer's experts' h for their down projection. The first
    layer's weighted sum is taken in the next norm's launch, the last layer's (no norm after it) in its own."""
    expected = tensorfold.load(moe_folder, backend="numpy").logits(IDS)
    model = tensorfold.load(moe_folder, backend="cuda")
    router = model.net.weights["layers.0.mlp.gate.weight"]
    assert (router.bits, model.net.experts["layers.0.mlp."].gate_up.bits) == (8, 4)
    launched.clear()
    assert model.logits(IDS).tobytes() == expected.tobytes()
    assert launched["add_rmsnorm_digits"] == 2 and launched["combine_add_rmsnorm_digits"] == 1
    assert launched["combine_kernel"] == 1 and launched["quantize"] == 3


def test_the_layouts_most_readers_read_are_written_first():
    four, eight = (Linear("affine", 96, 64, None, bits=bits, group_size=32) for bits in (4, 8))
    wide_groups = Linear("affine", 96, 64, None, bits=4, group_size=64)
    rows = 3
    (words4, pad), words8 = gemm_launch.quantize_shape(rows, 4, 32, 64), gemm_launch.quantize_shape(rows, 8, 32, 64)[0]
    assert gemm_launch.reader_layout([eight, four, four], rows, 64) == (((4, words4), (8, words8)), 32, pad)
    assert gemm_launch.reader_layout([eight, four], rows, 64)[0] == ((8, words8), (4, words4))  # the first of equals
    assert gemm_launch.reader_layout([four, wide_groups], rows, 64)[0] == ((4, words4),)  # one group size
    assert gemm_launch.reader_layout([Linear("bf16", 96, 64, None)], rows, 64) is None
    assert gemm_launch.reader_layout([four], rows, 32) is None  # a Linear that reads another width


def test_a_gemm_of_another_layout_quantizes_for_itself(launched):
    """Digits laid out for 4-bit steps are not read by an 8-bit GEMM: it quantizes x itself."""
    words, pad = gemm_launch.quantize_shape(3, 4, 32, 64)
    y = rmsnorm.rmsnorm_launch(cuda.to_device(np.ones((3, 64), np.float32)), cuda.to_device(np.ones(64, np.float32)),
                               1e-6, layout=(((4, words),), 32, pad))
    launched.clear()
    assert quantized_for(y, 4, 32, words, pad) is y.gemm_digits[4, 32, words] and not launched
    quantized_for(y, 8, 32, gemm_launch.quantize_shape(3, 8, 32, 64)[0], pad)
    assert launched["quantize"] == 1
