"""Writing Qwen3.5 checkpoints: HF safetensors (bf16 or f32) and MLX affine 4/8-bit, in the exact layouts the
loader (and transformers, and mlx-lm) read.

Input tensors use the canonical names and the HF logical form: centred norm weights, conv weights [C, 1, K].
The MLX form follows mlx-lm's conversion: names under `language_model.`, conv [C, K, 1], `+1` folded into the
centred norms, every Linear and the embedding quantized when its input width is a multiple of the group size,
`A_log` kept in float32, a tied model without `lm_head`.
"""
import dataclasses
import json
import os
import shutil

import numpy as np

from tensorfold.model.checkpoint import CENTRED_NORMS
from tensorfold.model.config import ModelConfig, Quantization
from tensorfold.model.safetensors_io import write_file
from tensorfold.numerics.formats import f32_to_bf16, quantize_affine

FORMATS = ("hf", "hf-f32", "mlx4", "mlx8")


def dense_tensors(weights: dict) -> dict:
    """Loaded weights (Linear objects, norm multipliers, conv [C, K]) back in canonical HF form, float32."""
    tensors = {}
    for name, value in weights.items():
        if hasattr(value, "dense"):
            tensors[name] = value.dense()
        elif name.endswith("conv1d.weight"):
            tensors[name] = value[:, None, :]
        elif name == "norm.weight" or name.endswith(CENTRED_NORMS):
            tensors[name] = (value - np.float32(1.0)).astype(np.float32)
        else:
            tensors[name] = value
    return tensors


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def write_checkpoint(folder, config: ModelConfig, tensors: dict, fmt: str = "hf", group_size: int = 64,
                     tokenizer_from=None) -> None:
    """Write config.json and model.safetensors in format `fmt` ("hf", "hf-f32", "mlx4" or "mlx8"), and copy the
    tokenizer files of the checkpoint folder `tokenizer_from` if given."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown checkpoint format {fmt!r}: choose one of {', '.join(FORMATS)}")
    os.makedirs(folder, exist_ok=True)
    for name in TOKENIZER_FILES if tokenizer_from else ():
        if os.path.exists(os.path.join(tokenizer_from, name)):
            shutil.copyfile(os.path.join(tokenizer_from, name), os.path.join(folder, name))
    stored = {}
    if fmt.startswith("hf"):
        float_dtype = "F32" if fmt == "hf-f32" else "BF16"
        for name, value in tensors.items():
            key = name if name == "lm_head.weight" else "model." + name
            stored[key] = _float_entry(name, value, float_dtype)
        config_dict = dataclasses.replace(config, quantization=None).to_dict()
    else:
        bits = 4 if fmt == "mlx4" else 8
        for name, value in tensors.items():
            key = "language_model." + (name if name == "lm_head.weight" else "model." + name)
            if name.endswith("conv1d.weight"):
                value = value.transpose(0, 2, 1)  # [C, 1, K] -> MLX [C, K, 1]
            if name == "norm.weight" or name.endswith(CENTRED_NORMS):
                value = value + np.float32(1.0)  # MLX norms multiply by the stored weight directly
            if value.ndim == 2 and value.shape[1] % group_size == 0:
                packed, scales, biases = quantize_affine(value, bits, group_size)
                module = key[:-len(".weight")]
                stored[key] = ("U32", packed)
                stored[module + ".scales"] = ("BF16", scales)
                stored[module + ".biases"] = ("BF16", biases)
            else:
                stored[key] = _float_entry(name, value, "BF16")
        quantization = Quantization(bits=bits, group_size=group_size, mode="affine", overrides={})
        text = dataclasses.replace(config, quantization=None).to_dict()
        config_dict = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
                       "text_config": text, "tie_word_embeddings": config.tie_word_embeddings,
                       "eos_token_id": list(config.eos_token_ids),
                       "quantization": quantization.to_dict(), "quantization_config": quantization.to_dict()}
    write_file(os.path.join(folder, "model.safetensors"), stored, metadata={"format": "pt"})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config_dict, f, indent=2)
        f.write("\n")


def _float_entry(name, value, dtype):
    """A float tensor as a (dtype, array) entry; A_log stays float32 as in every released checkpoint."""
    value = np.asarray(value, np.float32)
    if dtype == "F32" or name.endswith("A_log"):
        return "F32", value
    return "BF16", f32_to_bf16(value)
