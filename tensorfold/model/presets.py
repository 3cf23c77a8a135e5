"""The configs of released Qwen3.5 sizes (text model), dense and MoE, for random-weight checkpoints of the real
shapes (kernel tests, benchmarks). Values from the Qwen3.5 model cards and configs."""
import dataclasses

from tensorfold.model.config import ModelConfig

L, F = "linear_attention", "full_attention"

_BASE = dict(model_type="qwen3_5_text", vocab_size=248320, head_dim=256, linear_num_key_heads=16,
             linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
             rope_theta=1e7, partial_rotary_factor=0.25, max_position_embeddings=262144,
             eos_token_ids=(248046, 248044), quantization=None)


def _preset(hidden, layers, heads, kv_heads, value_heads, intermediate, tied, **moe):
    return ModelConfig(**{**_BASE, **moe}, hidden_size=hidden, num_hidden_layers=layers,
                       layer_types=tuple(F if (i + 1) % 4 == 0 else L for i in range(layers)),
                       num_attention_heads=heads, num_key_value_heads=kv_heads, linear_num_value_heads=value_heads,
                       intermediate_size=intermediate, tie_word_embeddings=tied)


PRESETS = {
    "0.8B": _preset(1024, 24, 8, 2, 16, 3584, True),
    "2B": _preset(2048, 24, 8, 2, 16, 6144, True),
    "4B": _preset(2560, 32, 16, 4, 32, 9216, True),
    # 256 routed experts of width 512, 8 a token, beside a shared expert of width 512
    "35B-A3B": _preset(2048, 40, 16, 2, 32, 0, False, model_type="qwen3_5_moe_text", num_experts=256,
                       num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512),
}


def preset(name: str, **changes) -> ModelConfig:
    """A released size's config, optionally changed (e.g. fewer layers for a quick check)."""
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}")
    if "num_hidden_layers" in changes and "layer_types" not in changes:
        changes["layer_types"] = PRESETS[name].layer_types[:changes["num_hidden_layers"]]
    return dataclasses.replace(PRESETS[name], **changes)
