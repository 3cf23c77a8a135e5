"""`tensorfold make-tiny`: small random Qwen3.5 checkpoints for tests and tutorials, built offline.

The weights are random but not default: centred norm weights, the gated norm, `A_log` and `dt_bias` are all
drawn away from their initial values, so that a `1 + w` versus `w` mistake, or a wrong gate, changes the logits.
The tokenizer is a small byte-level BPE trained on a built-in text, with a ChatML chat template.
"""
import dataclasses

import numpy as np

from tensorfold.model.checkpoint import expected_shapes
from tensorfold.model.config import ModelConfig
from tensorfold.model.tiny_corpus import TINY_CORPUS
from tensorfold.model.tokenizer import Tokenizer, train_bpe_tokenizer
from tensorfold.model.writer import write_checkpoint

L, F = "linear_attention", "full_attention"

TINY_CONFIG = ModelConfig(
    model_type="qwen3_5_text", vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
    layer_types=(L, L, L, F), num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_conv_kernel_dim=4, rms_norm_eps=1e-6, rope_theta=1e7, partial_rotary_factor=0.25,
    tie_word_embeddings=False, max_position_embeddings=4096, eos_token_ids=(2, 0), quantization=None)

# The MoE member at the same widths: eight experts, two a row, every width a whole quantization group (64).
TINY_MOE_CONFIG = dataclasses.replace(
    TINY_CONFIG, model_type="qwen3_5_moe_text", intermediate_size=0, num_experts=8, num_experts_per_tok=2,
    moe_intermediate_size=64, shared_expert_intermediate_size=64)


def random_tensors(config: ModelConfig, seed: int) -> dict:
    """Random float32 weights in canonical HF form for every tensor the config implies."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in expected_shapes(config).items():
        if name.endswith("A_log"):
            value = np.log(rng.uniform(1.0, 16.0, shape))
        elif name.endswith("dt_bias"):
            value = rng.normal(0.0, 1.0, shape)
        elif name.endswith("linear_attn.norm.weight"):
            value = 1.0 + rng.normal(0.0, 0.3, shape)  # the plain norm: its weight multiplies directly
        elif len(shape) == 1:
            value = rng.normal(0.0, 0.3, shape)  # centred norms: the model multiplies by 1 + w
        elif name.endswith("conv1d.weight"):
            value = rng.normal(0.0, 0.5, shape)
        elif name.endswith("embed_tokens.weight"):
            value = rng.normal(0.0, 1.0, shape)
        else:
            value = rng.normal(0.0, 1.0 / np.sqrt(shape[-1]), shape)  # an expert stack's last axis is its input
        tensors[name] = value.astype(np.float32)
    return tensors


def make_tiny(folder, seed: int = 0, fmt: str = "hf", config: ModelConfig = TINY_CONFIG) -> ModelConfig:
    """Write a random checkpoint (config, weights, tokenizer, chat template) into `folder`; returns its config."""
    train_bpe_tokenizer([TINY_CORPUS], config.vocab_size - 4, folder)  # the trainer adds 4 tokens of its own
    tokenizer = Tokenizer.from_folder(folder)
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} ids but vocab_size is {config.vocab_size}")
    config = dataclasses.replace(config, eos_token_ids=tokenizer.stop_ids)
    write_checkpoint(folder, config, random_tensors(config, seed), fmt)
    return config
