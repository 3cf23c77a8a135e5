"""ModelConfig: both config.json layouts, rope and layer-type fallbacks, quantization, round trip, validation."""
import copy
import json

import pytest

from tensorfold.errors import ConfigError
from tensorfold.model.config import ModelConfig, QuantSpec

L, F = "linear_attention", "full_attention"

# The tiny model of the spec (§6), as a flat text-only config.json.
FLAT = {
    "model_type": "qwen3_5_text",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "layer_types": [L, L, L, F],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 1e7,
        "partial_rotary_factor": 0.25,
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    },
    "eos_token_id": 7,
}


def composite(text_config: dict, **top) -> dict:
    """Wrap text-model fields the way released checkpoints store them."""
    text = {"model_type": "qwen3_5_text", **text_config}
    return {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": text, **top}


def flat(**changes) -> dict:
    """FLAT with some fields changed; a value of None removes the field."""
    d = copy.deepcopy(FLAT)
    d.update(changes)
    return {k: v for k, v in d.items() if v is not None}


def test_flat_config_fields_and_derived_sizes():
    config = ModelConfig.from_dict(FLAT)
    assert config.model_type == "qwen3_5_text"
    assert config.layer_types == (L, L, L, F)
    assert config.full_attention_layers == (3,)
    assert config.rotary_dim == 8
    assert config.conv_dim == 2 * 2 * 16 + 4 * 16
    assert config.rope_theta == 1e7 and config.partial_rotary_factor == 0.25
    assert config.eos_token_ids == (7,)
    assert config.quantization is None


def test_composite_layout_equals_flat_layout():
    text = {k: v for k, v in FLAT.items() if k not in ("model_type", "eos_token_id")}
    d = composite(text, eos_token_id=7)
    config = ModelConfig.from_dict(d)
    assert config.model_type == "qwen3_5"
    assert config == ModelConfig.from_dict(FLAT)


def test_text_config_wins_over_top_level_and_eos_ids_merge():
    d = composite({**FLAT, "hidden_size": 128, "eos_token_id": 5}, hidden_size=999, eos_token_id=[6, 5])
    config = ModelConfig.from_dict(d)
    assert config.hidden_size == 128
    assert config.eos_token_ids == (5, 6)


def test_tie_word_embeddings_from_text_config_then_top_level():
    untied = {k: v for k, v in FLAT.items() if k != "tie_word_embeddings"}
    assert ModelConfig.from_dict(composite(untied)).tie_word_embeddings is False
    assert ModelConfig.from_dict(composite(untied, tie_word_embeddings=True)).tie_word_embeddings is True
    text = {**untied, "tie_word_embeddings": False}
    assert ModelConfig.from_dict(composite(text, tie_word_embeddings=True)).tie_word_embeddings is False


def test_released_0_8b_composite_config():
    text = {
        "vocab_size": 248320, "hidden_size": 1024, "intermediate_size": 3584, "num_hidden_layers": 24,
        "full_attention_interval": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
        "linear_num_key_heads": 16, "linear_num_value_heads": 16, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144, "eos_token_id": 248044, "attn_output_gate": True, "mtp_num_hidden_layers": 1,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10], "mrope_interleaved": True},
    }
    config = ModelConfig.from_dict(composite(text, tie_word_embeddings=True, eos_token_id=248046))
    assert config.full_attention_layers == (3, 7, 11, 15, 19, 23)
    assert config.conv_dim == 6144 and config.rotary_dim == 64
    assert config.rope_theta == 1e7 and isinstance(config.rope_theta, float)
    assert config.tie_word_embeddings and config.eos_token_ids == (248044, 248046)


def test_legacy_rope_fields_equal_rope_parameters():
    legacy = flat(rope_parameters=None, rope_theta=1e7, partial_rotary_factor=0.25, rope_scaling={"type": "default"})
    assert ModelConfig.from_dict(legacy) == ModelConfig.from_dict(FLAT)


def test_rope_defaults_when_absent():
    config = ModelConfig.from_dict(flat(rope_parameters=None))
    assert (config.rope_theta, config.partial_rotary_factor) == (10000.0, 0.25)


def test_layer_types_from_full_attention_interval():
    config = ModelConfig.from_dict(flat(layer_types=None, num_hidden_layers=8))
    assert config.full_attention_layers == (3, 7)
    assert config == ModelConfig.from_dict(flat(num_hidden_layers=8, layer_types=[L, L, L, F] * 2))
    config = ModelConfig.from_dict(flat(layer_types=None, full_attention_interval=2))
    assert config.layer_types == (L, F, L, F)


def test_defaults_for_optional_fields():
    d = flat(linear_conv_kernel_dim=None, rms_norm_eps=None, tie_word_embeddings=None, eos_token_id=None)
    config = ModelConfig.from_dict(d)
    assert config.linear_conv_kernel_dim == 4
    assert config.rms_norm_eps == 1e-6
    assert config.max_position_embeddings == 262144
    assert config.tie_word_embeddings is False
    assert config.eos_token_ids == ()


QUANTIZATION = {
    "group_size": 64,
    "bits": 4,
    "mode": "affine",
    "language_model.model.layers.0.mlp.gate": {"group_size": 64, "bits": 8},
    "language_model.model.layers.1.mlp.gate": {"bits": 8},
    "language_model.model.layers.2.linear_attn.in_proj_a": False,
}


def test_quantization_with_overrides():
    q = ModelConfig.from_dict(flat(quantization=QUANTIZATION, quantization_config=QUANTIZATION)).quantization
    assert (q.bits, q.group_size, q.mode) == (4, 64, "affine")
    assert q.overrides == {
        "language_model.model.layers.0.mlp.gate": QuantSpec(8, 64),
        "language_model.model.layers.1.mlp.gate": QuantSpec(8, 64),
    }
    assert q.spec_for("language_model.model.layers.0.mlp.gate") == QuantSpec(8, 64)
    assert q.spec_for("language_model.model.layers.0.mlp.up_proj") == QuantSpec(4, 64)


def test_quantization_config_alone_is_read():
    q = ModelConfig.from_dict(flat(quantization_config={"bits": 8, "group_size": 32})).quantization
    assert (q.bits, q.group_size, q.mode, q.overrides) == (8, 32, "affine", {})


@pytest.mark.parametrize("d", [FLAT, flat(quantization=QUANTIZATION)], ids=["float", "quantized"])
def test_to_dict_round_trip(d, tmp_path):
    config = ModelConfig.from_dict(d)
    written = config.to_dict()
    assert written["model_type"] == "qwen3_5_text"
    assert written["architectures"] == ["Qwen3_5ForCausalLM"]
    assert written["rope_parameters"]["mrope_section"] == [2, 1, 1]
    (tmp_path / "config.json").write_text(json.dumps(written))
    assert ModelConfig.from_file(tmp_path) == config
    assert ModelConfig.from_file(tmp_path / "config.json") == config
    if config.quantization:
        assert written["quantization"] == written["quantization_config"]
        assert written["quantization"]["language_model.model.layers.1.mlp.gate"] == {"bits": 8, "group_size": 64}


def test_to_dict_mrope_section_covers_the_rotary_pairs():
    config = ModelConfig.from_dict(flat(head_dim=256))
    assert config.to_dict()["rope_parameters"]["mrope_section"] == [11, 11, 10]


def test_transformers_reads_to_dict():
    from transformers import Qwen3_5TextConfig

    config = ModelConfig.from_dict(FLAT)
    hf = Qwen3_5TextConfig(**config.to_dict())
    assert hf.layer_types == list(config.layer_types)
    assert hf.rope_parameters["rope_theta"] == 1e7
    assert ModelConfig.from_dict(hf.to_dict()) == config


def test_from_file_errors_name_the_path(tmp_path):
    with pytest.raises(ConfigError, match="nowhere.json"):
        ModelConfig.from_file(tmp_path / "nowhere.json")
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="config.json is not valid JSON"):
        ModelConfig.from_file(tmp_path)


# One bad field per case, on top of the valid FLAT config; the message must name the field and its value.
INVALID = {
    "missing vocab_size": (flat(vocab_size=None), "missing required field vocab_size"),
    "missing linear_value_head_dim": (flat(linear_value_head_dim=None), "missing required field linear_value_head_dim"),
    "moe without experts": (flat(model_type="qwen3_5_moe_text"), "missing required field num_experts"),
    "other model_type": (flat(model_type="llama"), "model_type 'llama'"),
    "text_config model_type": (composite({**FLAT, "model_type": "qwen3_5_moe_text"}),
                               "text_config.model_type 'qwen3_5_moe_text' does not belong to model_type 'qwen3_5'"),
    "zero size": (flat(hidden_size=0), "hidden_size must be a positive integer, got 0"),
    "negative size": (flat(intermediate_size=-128), "intermediate_size must be a positive integer, got -128"),
    "float size": (flat(head_dim=32.0), r"head_dim must be a positive integer, got 32\.0"),
    "bool size": (flat(linear_conv_kernel_dim=True), "linear_conv_kernel_dim must be a positive integer, got True"),
    "string size": (flat(vocab_size="512"), "vocab_size must be a positive integer, got '512'"),
    "max positions": (flat(max_position_embeddings=0), "max_position_embeddings must be a positive integer, got 0"),
    "interval": (flat(layer_types=None, full_attention_interval=0), "full_attention_interval .* got 0"),
    "eps": (flat(rms_norm_eps=0), "rms_norm_eps must be a positive number, got 0"),
    "rope_theta": (flat(rope_parameters={"rope_theta": -1.0}), r"rope_theta must be a positive number, got -1\.0"),
    "factor zero": (flat(rope_parameters={"partial_rotary_factor": 0}), "partial_rotary_factor .* got 0"),
    "factor above 1": (flat(rope_parameters={"partial_rotary_factor": 1.5}), r"partial_rotary_factor .* 1, got 1\.5"),
    "rope_type": (flat(rope_parameters={"rope_type": "yarn"}), "rope_type 'yarn' is not supported"),
    "rope_scaling": (flat(rope_scaling={"type": "linear", "factor": 2.0}), "rope_scaling type 'linear'"),
    "tie": (flat(tie_word_embeddings="yes"), "tie_word_embeddings must be true or false, got 'yes'"),
    "gqa": (flat(num_attention_heads=6, num_key_value_heads=4),
            r"num_attention_heads \(6\) must be a multiple of num_key_value_heads \(4\)"),
    "linear heads": (flat(linear_num_value_heads=3),
                     r"linear_num_value_heads \(3\) must be a multiple of linear_num_key_heads \(2\)"),
    "layer count": (flat(num_hidden_layers=5), "layer_types has 4 entries but num_hidden_layers is 5"),
    "layer name": (flat(layer_types=[L, "sliding_attention", L, F]), r"layer_types\[1\] is 'sliding_attention'"),
    "no full layer": (flat(layer_types=[L, L, L, L]), "at least one 'full_attention' layer, got 4"),
    "odd rotary dim": (flat(head_dim=28), r"head_dim \(28\) \* partial_rotary_factor \(0\.25\) gives rotary dim 7"),
    "tiny rotary dim": (flat(head_dim=4), r"head_dim \(4\) .* gives rotary dim 1"),
    "eos": (flat(eos_token_id=[7, -1]), "eos_token_id .* got -1"),
    "quant bits": (flat(quantization={"bits": 3, "group_size": 64}), "quantization bits must be 4 or 8, got 3"),
    "quant group": (flat(quantization={"bits": 4, "group_size": 0}), "group_size must be a positive integer, got 0"),
    "quant mode": (flat(quantization={"bits": 4, "group_size": 32, "mode": "mxfp4"}), "mode 'mxfp4' is not supported"),
    "quant missing bits": (flat(quantization={"group_size": 64}), "quantization is missing required field bits"),
    "override bits": (flat(quantization={"bits": 4, "group_size": 64, "a.gate": {"bits": 2}}),
                      r"quantization\['a.gate'\] bits must be 4 or 8, got 2"),
    "override mode": (flat(quantization={"bits": 4, "group_size": 64, "a.gate": {"mode": "nvfp4"}}),
                      r"quantization\['a.gate'\] mode 'nvfp4'"),
    "hf quant_method": (flat(quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 128}),
                        "quantization_config.quant_method 'gptq' is not supported"),
}


@pytest.mark.parametrize("d, message", INVALID.values(), ids=INVALID.keys())
def test_invalid_config_raises_naming_field_and_value(d, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_dict(d)
