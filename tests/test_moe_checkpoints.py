"""MoE configs and checkpoints: the composite and text-only configs, the three layouts of the routed experts (HF
per-expert, HF fused, MLX switch_mlp in 4 and 8 bits), and a refusal naming the field or tensor for each mistake."""
import dataclasses
import json
import os
import shutil

import numpy as np
import pytest

import tensorfold
from tensorfold.errors import CheckpointError, ConfigError
from tensorfold.model.checkpoint import load_weights
from tensorfold.model.config import ModelConfig
from tensorfold.model.safetensors_io import read_header, write_file
from tensorfold.model.tiny import TINY_MOE_CONFIG, make_tiny, random_tensors
from tensorfold.model.writer import dense_tensors

MOE = dataclasses.replace(TINY_MOE_CONFIG, num_experts=4, num_hidden_layers=2, layer_types=(
    "linear_attention", "full_attention"))
FLAT = MOE.to_dict()


def tensors_of(folder):
    return {n: (i.dtype, i.read()) for n, i in read_header(os.path.join(folder, "model.safetensors")).items()}


def rewrite(src, dst, change):
    shutil.copytree(src, dst)
    write_file(os.path.join(dst, "model.safetensors"), change(tensors_of(src)))
    return str(dst)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """fmt -> folder of the same random MoE weights in each format."""
    folders = {}
    for fmt in ("hf-f32", "mlx4", "mlx8"):
        folders[fmt] = str(tmp_path_factory.mktemp(fmt))
        make_tiny(folders[fmt], seed=4, fmt=fmt, config=MOE)
    return folders


# --- configs ------------------------------------------------------------------------------------------------------

def test_composite_and_text_only_configs_parse_alike():
    composite = {"model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"],
                 "text_config": FLAT, "tie_word_embeddings": FLAT["tie_word_embeddings"]}
    flat = ModelConfig.from_dict(FLAT)
    assert flat.is_moe and ModelConfig.from_dict(composite) == flat
    assert flat.intermediate_size == 0 and "intermediate_size" not in FLAT


def test_transformers_reads_the_moe_config():
    from transformers import Qwen3_5MoeTextConfig
    config = ModelConfig.from_dict(FLAT)
    hf = Qwen3_5MoeTextConfig(**config.to_dict())
    assert (hf.num_experts, hf.num_experts_per_tok, hf.moe_intermediate_size) == (4, 2, 64)
    assert ModelConfig.from_dict(hf.to_dict()) == config


INVALID = {
    "zero experts": ({"num_experts": 0}, "num_experts must be a positive integer, got 0"),
    "too many experts": ({"num_experts": 5000}, "num_experts must be at most 4096"),
    "top-k above experts": ({"num_experts_per_tok": 5}, r"num_experts_per_tok \(5\) must be at most num_experts \(4\)"),
    "zero top-k": ({"num_experts_per_tok": 0}, "num_experts_per_tok must be a positive integer, got 0"),
    "float width": ({"moe_intermediate_size": 64.0}, r"moe_intermediate_size must be a positive integer, got 64\.0"),
    "no shared width": ({"shared_expert_intermediate_size": None}, "missing required field shared_expert_intermediate"),
    "unnormalised weights": ({"norm_topk_prob": False}, "norm_topk_prob False is not supported"),
    "dense layers between": ({"decoder_sparse_step": 2}, "decoder_sparse_step 2 is not supported"),
    "dense-only layers": ({"mlp_only_layers": [0]}, r"mlp_only_layers \[0\] is not supported"),
    "dense text in an moe": ({"model_type": "qwen3_5_moe", "text_config": {"model_type": "qwen3_5_text"}},
                             "text_config.model_type 'qwen3_5_text' does not belong to model_type 'qwen3_5_moe'"),
}


@pytest.mark.parametrize("change, message", INVALID.values(), ids=INVALID.keys())
def test_invalid_moe_config_is_refused_by_name(change, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_dict({**FLAT, **change})


def test_sizes_of_the_other_family_are_refused():
    with pytest.raises(ConfigError, match="num_experts is 4, but a dense model has none"):
        dataclasses.replace(MOE, model_type="qwen3_5_text", intermediate_size=128)
    with pytest.raises(ConfigError, match="intermediate_size is 128, but an MoE model has none"):
        dataclasses.replace(MOE, intermediate_size=128)


# --- the three layouts --------------------------------------------------------------------------------------------

def test_hf_per_expert_tensors_load_as_written(written):
    folder = written["hf-f32"]
    names = read_header(os.path.join(folder, "model.safetensors"))
    assert "model.layers.0.mlp.experts.3.down_proj.weight" in names and "model.layers.0.mlp.gate.weight" in names
    config = ModelConfig.from_file(folder)
    loaded = dense_tensors(load_weights(folder, config))
    for name, value in random_tensors(config, 4).items():
        if value.ndim >= 2:  # the matrices (norm weights come back as 1 + w, rounded)
            np.testing.assert_array_equal(loaded[name].reshape(value.shape), value, err_msg=name)


def fused(tensors):
    """Per-expert tensors rewritten as the fused HF form: experts.gate_up_proj [E, 2 I, D], experts.down_proj."""
    out, experts = {}, MOE.num_experts
    for name, entry in tensors.items():
        if ".experts." not in name:
            out[name] = entry
        elif name.endswith("experts.0.gate_proj.weight"):
            p = name[:-len("0.gate_proj.weight")]
            out[p + "gate_up_proj"] = ("F32", np.stack([np.concatenate(
                [tensors[f"{p}{e}.gate_proj.weight"][1], tensors[f"{p}{e}.up_proj.weight"][1]]) for e in range(experts)]))
            out[p + "down_proj"] = ("F32", np.stack([tensors[f"{p}{e}.down_proj.weight"][1] for e in range(experts)]))
    return out


def test_hf_fused_experts_give_the_same_logits(written, tmp_path):
    folder = rewrite(written["hf-f32"], tmp_path / "fused", fused)
    assert "model.layers.1.mlp.experts.gate_up_proj" in read_header(os.path.join(folder, "model.safetensors"))
    ids = np.arange(1, 30)
    per_expert = tensorfold.load(written["hf-f32"], backend="numpy").logits(ids)
    assert tensorfold.load(folder, backend="numpy").logits(ids).tobytes() == per_expert.tobytes()


@pytest.mark.parametrize("fmt, bits", [("mlx4", 4), ("mlx8", 8)])
def test_mlx_switch_mlp_stacks(written, fmt, bits):
    folder = written[fmt]
    stored = read_header(os.path.join(folder, "model.safetensors"))
    gate = stored["language_model.model.layers.0.mlp.switch_mlp.gate_proj.weight"]
    assert gate.dtype == "U32" and gate.shape == (4, 64, 64 * bits // 32)
    assert stored["language_model.model.layers.0.mlp.switch_mlp.down_proj.scales"].shape == (4, 64, 1)
    quantization = json.load(open(os.path.join(folder, "config.json")))["quantization"]
    if bits == 4:  # the router and the shared expert's gate at 8 bits, as mlx-lm quantizes them
        assert quantization["language_model.model.layers.0.mlp.gate"] == {"bits": 8, "group_size": 64}
    weights = load_weights(folder, ModelConfig.from_file(folder))
    experts = weights["layers.0.mlp.experts.gate_up_proj"]
    assert (experts.kind, experts.bits, experts.out_features) == ("affine", bits, 4 * 2 * 64)
    assert weights["layers.0.mlp.shared_expert_gate.weight"].bits == 8
    # expert 2's up rows are switch_mlp.up_proj's expert 2
    up = stored["language_model.model.layers.0.mlp.switch_mlp.up_proj.weight"].read()
    np.testing.assert_array_equal(experts.data[2 * 128 + 64:3 * 128], up[2])


def drop(name):
    return lambda tensors: {n: v for n, v in tensors.items() if n != name}


def add(name, entry):
    return lambda tensors: {**tensors, name: entry}


BROKEN = {
    "an expert missing": ("hf-f32", drop("model.layers.1.mlp.experts.2.up_proj.weight"),
                          r"missing tensor layers\.1\.mlp\.experts\.2\.up_proj\.weight \(the model has 4 experts\)"),
    "an expert too many": ("hf-f32", add("model.layers.0.mlp.experts.4.gate_proj.weight",
                                         ("F32", np.zeros((64, 64), np.float32))),
                           "unexpected tensor model.layers.0.mlp.experts.4.gate_proj.weight"),
    "an expert of another width": ("hf-f32", add("model.layers.0.mlp.experts.1.gate_proj.weight",
                                                 ("F32", np.zeros((32, 64), np.float32))),
                                   r"experts\.1\.gate_proj\.weight: shape \[32, 64\], expected \[64, 64\]"),
    "up stack missing": ("mlx4", drop("language_model.model.layers.0.mlp.switch_mlp.up_proj.weight"),
                         r"missing tensor layers\.0\.mlp\.switch_mlp\.up_proj\.weight"),
    "up scales missing": ("mlx4", drop("language_model.model.layers.0.mlp.switch_mlp.up_proj.scales"),
                          "switch_mlp.gate_proj.scales: its partner among gate_proj and up_proj lacks .scales"),
    "router missing": ("mlx4", lambda t: {n: v for n, v in t.items() if ".mlp.gate." not in n or "layers.1" in n},
                       r"missing tensor layers\.0\.mlp\.gate\.weight"),
}


@pytest.mark.parametrize("fmt, change, message", BROKEN.values(), ids=BROKEN.keys())
def test_broken_moe_checkpoints_are_refused_by_name(written, tmp_path, fmt, change, message):
    folder = rewrite(written[fmt], tmp_path / "broken", change)
    with pytest.raises(CheckpointError, match=message):
        load_weights(folder, ModelConfig.from_file(folder))


def test_gate_and_up_of_different_bits_are_refused(written, tmp_path):
    folder = str(tmp_path / "mixed")
    shutil.copytree(written["mlx4"], folder)
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    config["quantization"]["language_model.model.layers.0.mlp.switch_mlp.up_proj"] = {"bits": 8, "group_size": 64}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    with pytest.raises(CheckpointError, match="switch_mlp.up_proj.weight: quantized as .*bits=8"):
        load_weights(folder, ModelConfig.from_file(folder))


def test_bench_writes_random_mlx4_moe_checkpoints(tmp_path):
    """`tensorfold bench`'s random 4-bit checkpoints, drawn packed, in the MoE shapes (the 35B-A3B preset's at
    the tiny widths): they load, stacked as switch_mlp, and run."""
    from tensorfold.cli.bench.checkpoint import write_random_mlx4
    from tensorfold.model.presets import preset
    assert preset("35B-A3B").is_moe and preset("35B-A3B").num_experts == 256
    write_random_mlx4(str(tmp_path), MOE, seed=0)
    stored = read_header(os.path.join(tmp_path, "matrices.safetensors"))
    assert stored["language_model.model.layers.1.mlp.switch_mlp.up_proj.weight"].shape == (4, 64, 8)
    model = tensorfold.load(str(tmp_path), backend="numpy")
    assert np.isfinite(model.logits([1, 2, 3])).all()
