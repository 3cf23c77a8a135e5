"""Writing Qwen3.5 checkpoints: HF safetensors (bf16 or f32) and MLX affine 4/8-bit, in the exact layouts the
loader (and transformers, and mlx-lm) read.

Input tensors use the canonical names and the HF logical form: centred norm weights, conv weights [C, 1, K].
The MLX form follows mlx-lm's conversion: names under `language_model.`, conv [C, K, 1], `+1` folded into the
centred norms, every Linear and the embedding quantized when its input width is a multiple of the group size,
`A_log` kept in float32, a tied model without `lm_head`.

An MoE model's routed experts (canonical `experts.gate_up_proj` [E, 2 I, D] and `experts.down_proj` [E, D, I])
are written per expert in the HF form, as transformers writes them, and as MLX's `switch_mlp` stacks in the MLX
form, whose router (`mlp.gate`) and `shared_expert_gate` are quantized to 8 bits as mlx-lm quantizes them.
"""
import dataclasses
import json
import os
import shutil

import numpy as np

from tensorfold.model.checkpoint import CENTRED_NORMS, expected_shapes
from tensorfold.model.config import ModelConfig, Quantization, QuantSpec
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
    shapes = expected_shapes(config)
    tensors = {name: np.reshape(value, shapes.get(name, np.shape(value))) for name, value in tensors.items()}
    if fmt.startswith("hf"):
        float_dtype = "F32" if fmt == "hf-f32" else "BF16"
        for name, value in per_expert(tensors).items():
            key = name if name == "lm_head.weight" else "model." + name
            stored[key] = _float_entry(name, value, float_dtype)
        config_dict = dataclasses.replace(config, quantization=None).to_dict()
    else:
        bits = 4 if fmt == "mlx4" else 8
        overrides = {}
        for name, value in switch_mlp(tensors).items():
            key = "language_model." + (name if name == "lm_head.weight" else "model." + name)
            if name.endswith("conv1d.weight"):
                value = value.transpose(0, 2, 1)  # [C, 1, K] -> MLX [C, K, 1]
            if name == "norm.weight" or name.endswith(CENTRED_NORMS):
                value = value + np.float32(1.0)  # MLX norms multiply by the stored weight directly
            if value.ndim >= 2 and value.shape[-1] % group_size == 0:
                module = key[:-len(".weight")]
                module_bits = 8 if name.endswith(EIGHT_BIT_MODULES) else bits
                if module_bits != bits:
                    overrides[module] = QuantSpec(module_bits, group_size)
                flat = value.reshape(-1, value.shape[-1])
                for part, array in zip(("weight", "scales", "biases"), quantize_affine(flat, module_bits, group_size)):
                    stored[f"{module}.{part}"] = ("U32" if part == "weight" else "BF16",
                                                  array.reshape(value.shape[:-1] + array.shape[-1:]))
            else:
                stored[key] = _float_entry(name, value, "BF16")
        quantization = Quantization(bits=bits, group_size=group_size, mode="affine", overrides=overrides)
        text = dataclasses.replace(config, quantization=None).to_dict()
        composite = "Qwen3_5MoeForConditionalGeneration" if config.is_moe else "Qwen3_5ForConditionalGeneration"
        config_dict = {"model_type": "qwen3_5_moe" if config.is_moe else "qwen3_5", "architectures": [composite],
                       "text_config": text, "tie_word_embeddings": config.tie_word_embeddings,
                       "eos_token_id": list(config.eos_token_ids),
                       "quantization": quantization.to_dict(), "quantization_config": quantization.to_dict()}
    write_file(os.path.join(folder, "model.safetensors"), stored, metadata={"format": "pt"})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config_dict, f, indent=2)
        f.write("\n")


# The modules mlx-lm quantizes to 8 bits whatever the model's bits: an MoE's router and shared-expert gate.
EIGHT_BIT_MODULES = ("mlp.gate.weight", "mlp.shared_expert_gate.weight")


def per_expert(tensors: dict) -> dict:
    """The tensors with each layer's expert stacks split into transformers' per-expert tensors."""
    out = {}
    for name, value in tensors.items():
        if name.endswith("experts.gate_up_proj"):
            width = value.shape[1] // 2
            for e, both in enumerate(value):
                out[f"{name[:-len('gate_up_proj')]}{e}.gate_proj.weight"] = both[:width]
                out[f"{name[:-len('gate_up_proj')]}{e}.up_proj.weight"] = both[width:]
        elif name.endswith("experts.down_proj"):
            for e, down in enumerate(value):
                out[f"{name[:-len('down_proj')]}{e}.down_proj.weight"] = down
        else:
            out[name] = value
    return out


def switch_mlp_parts(name: str, shape: tuple) -> list:
    """The MLX switch_mlp tensors that the expert stack `name` [E, out, in] is stored as: (canonical name, the
    stack's rows along its out axis) each; gate_up_proj splits into gate_proj and up_proj."""
    prefix = name.rsplit("experts.", 1)[0] + "switch_mlp."
    if name.endswith("gate_up_proj"):
        half = shape[1] // 2
        return [(prefix + "gate_proj.weight", slice(0, half)), (prefix + "up_proj.weight", slice(half, shape[1]))]
    return [(prefix + "down_proj.weight", slice(0, shape[1]))]


def switch_mlp(tensors: dict) -> dict:
    """The tensors with each layer's expert stacks as MLX's switch_mlp: gate, up and down stacks [E, out, in]."""
    out = {}
    for name, value in tensors.items():
        if ".experts." in name:
            out.update({part: value[:, rows] for part, rows in switch_mlp_parts(name, value.shape)})
        else:
            out[name] = value
    return out


def _float_entry(name, value, dtype):
    """A float tensor as a (dtype, array) entry; A_log stays float32 as in every released checkpoint."""
    value = np.asarray(value, np.float32)
    if dtype == "F32" or name.endswith("A_log"):
        return "F32", value
    return "BF16", f32_to_bf16(value)
