"""The MoE family's logits against transformers' Qwen3_5MoeForCausalLM in float32 on the same weights, at the
dense reference tests' bar (tests/test_reference.py), with controls for the block's own mistakes."""
import dataclasses

import numpy as np
import pytest

import tensorfold
from tensorfold.model.tiny import TINY_MOE_CONFIG, make_tiny
from test_reference import assert_matches_dequantized, relative_error  # the dense reference tests'

torch = pytest.importorskip("torch", reason="the reference extra (torch, transformers) is part of `.[test]`")
transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4  # max |diff| <= TOLERANCE * max |logit|, as for the dense models
PROMPT_LENGTHS = (1, 2, 33, 129)
# Top-3 of 6 experts, tied, and an irregular layer order: a second shape beside the tiny MoE config.
TIED = dataclasses.replace(TINY_MOE_CONFIG, num_experts=6, num_experts_per_tok=3, tie_word_embeddings=True,
                           num_hidden_layers=3, layer_types=("full_attention", "linear_attention", "linear_attention"))


def reference_logits(folder, ids):
    model = transformers.Qwen3_5MoeForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor(np.asarray(ids))[None]).logits[0].numpy()


@pytest.fixture(scope="module")
def moe_f32(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("moe_f32"))
    make_tiny(folder, seed=11, fmt="hf-f32", config=TINY_MOE_CONFIG)
    return folder


@pytest.mark.parametrize("config", [TINY_MOE_CONFIG, TIED], ids=["top2of8", "tied-top3of6"])
def test_moe_logits_match_transformers(tmp_path, config):
    make_tiny(tmp_path, seed=12, fmt="hf-f32", config=config)
    model = tensorfold.load(str(tmp_path), backend="numpy")
    ids = np.random.default_rng(1).integers(0, config.vocab_size, max(PROMPT_LENGTHS))
    for n in PROMPT_LENGTHS:
        error = relative_error(model.logits(ids[:n]), reference_logits(str(tmp_path), ids[:n]))
        assert error <= TOLERANCE, f"{n} tokens: relative error {error:.2e}"


@pytest.mark.parametrize("fmt", ["mlx4", "mlx8"])
def test_moe_affine_logits_match_transformers_on_the_dequantized_weights(tmp_path, fmt):
    """An MLX MoE checkpoint (experts stacked as switch_mlp, router and shared gate 8-bit, every linear layer through
    the exact integer GEMM) against transformers on the same weights dequantized into a float32 checkpoint."""
    make_tiny(tmp_path / "mlx", seed=13, fmt=fmt, config=TINY_MOE_CONFIG)
    model = tensorfold.load(str(tmp_path / "mlx"), backend="numpy")
    assert model.net.weights["layers.0.mlp.gate.weight"].bits == 8
    assert model.net.weights["layers.0.mlp.experts.gate_up_proj"].bits == (4 if fmt == "mlx4" else 8)
    assert_matches_dequantized(model, tmp_path / "dense", fmt, reference_logits, PROMPT_LENGTHS)


def swap_experts(model, layer, a, b):
    """Experts a and b of one layer trade their gate/up and down rows (in place: the model reads the views)."""
    experts = model.net.experts[f"layers.{layer}.mlp."]
    for views in (experts.gate_up_views, experts.down_views):
        first, second = views[a].data.copy(), views[b].data.copy()
        views[a].data[...], views[b].data[...] = second, first


@pytest.mark.parametrize("mistake", ["experts swapped", "shared gate left out", "weights not renormalised",
                                     "rank 1 routed to the next expert"])
def test_moe_reference_catches_planted_mistakes(moe_f32, monkeypatch, mistake):
    """Controls: each mistake the block could make moves the logits far past the tolerance."""
    from tensorfold.cuda import moe
    model = tensorfold.load(moe_f32, backend="numpy")
    if mistake == "experts swapped":
        swap_experts(model, 0, 0, 1)
    elif mistake == "shared gate left out":
        monkeypatch.setattr(model.backend, "moe_combine", lambda routed, weights, shared, gate_logit: moe.combine(
            routed, weights, shared, np.full_like(gate_logit, 50.0)))  # sigmoid(50) = 1: the shared expert ungated
    elif mistake == "weights not renormalised":
        def unnormalised(logits, k):
            ids, _ = moe.route(logits, k)
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            return ids, np.take_along_axis(p / p.sum(axis=1, keepdims=True), ids, axis=1).astype(np.float32)
        monkeypatch.setattr(model.backend, "route", unnormalised)
    else:
        def misrouted(logits, k):
            ids, weights = moe.route(logits, k)
            ids[:, 1] = (ids[:, 1] + 1) % logits.shape[1]
            return ids, weights
        monkeypatch.setattr(model.backend, "route", misrouted)
    ids = np.random.default_rng(1).integers(0, model.config.vocab_size, 33)
    error = relative_error(model.logits(ids), reference_logits(moe_f32, ids))
    assert error > 100 * TOLERANCE, f"{mistake}: relative error only {error:.2e}"
