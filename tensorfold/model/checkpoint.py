"""Loading a Qwen3.5 checkpoint: a folder or a hub id, HF safetensors (bf16/f32) or MLX affine (4- and 8-bit).

The loader knows every tensor the config implies, with its shape, and refuses a checkpoint that lacks one, has one
too many, or disagrees on a shape or dtype, naming the tensor. Quantized weights stay packed: they are
dequantized inside the GEMV, so a 4-bit model takes about a quarter of its bf16 size.

Names are brought to one canonical form (`layers.3.self_attn.q_proj.weight`): HF text-only saves use the prefix
`model.`, released composite checkpoints `model.language_model.`, MLX conversions `language_model.model.` and
`language_model.lm_head.`. Vision and multi-token-prediction tensors are skipped.

MLX conversions differ from HF in two more ways that the loader undoes: the conv weight is stored [C, K, 1]
instead of [C, 1, K], and the centred norm weights already carry the `+1` (the norms multiply by them directly).
The conv layout tells the two apart, as mlx-lm itself decides.

An MoE layer's routed experts come in three layouts (experts.py gathers them): HF per-expert tensors
(`mlp.experts.{e}.gate_proj.weight`, what transformers writes), HF fused ones (`mlp.experts.gate_up_proj`
[E, 2 I, D] and `mlp.experts.down_proj` [E, D, I]) and MLX's stacked `mlp.switch_mlp.{gate,up,down}_proj`. They
load as two Linears, `mlp.experts.gate_up_proj` [E * 2 I, D] (each expert's gate rows, then its up rows) and
`mlp.experts.down_proj` [E * D, I]: expert e's rows are one contiguous block of each.
"""
import dataclasses
import math
import os

import numpy as np

from tensorfold.cuda.quantize import exact_factor_bits
from tensorfold.errors import CheckpointError
from tensorfold.model.config import ModelConfig
from tensorfold.model.experts import gather_experts
from tensorfold.model.files import brief, read_json_object
from tensorfold.model.safetensors_io import read_header
from tensorfold.numerics.formats import affine_rows, bf16_to_f32, significant_bits

PREFIXES = (("model.language_model.", ""), ("language_model.model.", ""), ("language_model.lm_head.", "lm_head."),
            ("model.", ""))
SKIPPED = ("model.visual.", "visual.", "vision_tower.", "mtp.", "model.mtp.", "language_model.mtp.")
FLOAT_DTYPES = ("F32", "BF16", "F16")
CENTRED_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight", "k_norm.weight")


@dataclasses.dataclass
class Linear:
    """A weight [out_features, in_features] in one of three forms: "f32", "bf16" (uint16 bits) or "affine"."""
    kind: str
    out_features: int
    in_features: int
    data: np.ndarray  # f32 values, bf16 bits, or packed uint32 codes
    scales: np.ndarray | None = None  # affine only: float32 [out, in / group_size]
    biases: np.ndarray | None = None
    bits: int = 0
    group_size: int = 0

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.data, self.scales, self.biases) if a is not None)

    def rows(self, ids) -> np.ndarray:
        """Rows `ids` as float32 (the embedding lookup); only those rows are dequantized."""
        ids = np.asarray(ids)
        if self.kind == "f32":
            return self.data[ids]
        if self.kind == "bf16":
            return bf16_to_f32(self.data[ids])
        return affine_rows(self.data, self.scales, self.biases, self.bits, self.group_size, ids)

    def dense(self) -> np.ndarray:
        """The whole weight as float32 (for tests and export, never on the hot path)."""
        return self.rows(np.arange(self.out_features))


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every canonical tensor name the config implies, with its logical shape (conv1d in the HF layout)."""
    c = config
    shapes = {"embed_tokens.weight": (c.vocab_size, c.hidden_size), "norm.weight": (c.hidden_size,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    for i, kind in enumerate(c.layer_types):
        p = f"layers.{i}."
        shapes[p + "input_layernorm.weight"] = (c.hidden_size,)
        shapes[p + "post_attention_layernorm.weight"] = (c.hidden_size,)
        shapes.update(sparse_shapes(c, p + "mlp.") if c.is_moe else {
            p + "mlp.gate_proj.weight": (c.intermediate_size, c.hidden_size),
            p + "mlp.up_proj.weight": (c.intermediate_size, c.hidden_size),
            p + "mlp.down_proj.weight": (c.hidden_size, c.intermediate_size)})
        if kind == "linear_attention":
            nv_dv = c.linear_num_value_heads * c.linear_value_head_dim
            a = p + "linear_attn."
            shapes[a + "in_proj_qkv.weight"] = (c.conv_dim, c.hidden_size)
            shapes[a + "in_proj_z.weight"] = (nv_dv, c.hidden_size)
            shapes[a + "in_proj_b.weight"] = (c.linear_num_value_heads, c.hidden_size)
            shapes[a + "in_proj_a.weight"] = (c.linear_num_value_heads, c.hidden_size)
            shapes[a + "conv1d.weight"] = (c.conv_dim, 1, c.linear_conv_kernel_dim)
            shapes[a + "A_log"] = (c.linear_num_value_heads,)
            shapes[a + "dt_bias"] = (c.linear_num_value_heads,)
            shapes[a + "norm.weight"] = (c.linear_value_head_dim,)
            shapes[a + "out_proj.weight"] = (c.hidden_size, nv_dv)
        else:
            a = p + "self_attn."
            shapes[a + "q_proj.weight"] = (2 * c.num_attention_heads * c.head_dim, c.hidden_size)
            shapes[a + "k_proj.weight"] = (c.num_key_value_heads * c.head_dim, c.hidden_size)
            shapes[a + "v_proj.weight"] = (c.num_key_value_heads * c.head_dim, c.hidden_size)
            shapes[a + "o_proj.weight"] = (c.hidden_size, c.num_attention_heads * c.head_dim)
            shapes[a + "q_norm.weight"] = (c.head_dim,)
            shapes[a + "k_norm.weight"] = (c.head_dim,)
    return shapes


def sparse_shapes(c: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
    """The tensors of one sparse block at prefix p (`layers.3.mlp.`): the router, the shared expert and its gate,
    and the routed experts stacked, [experts, out, in] (gate rows, then up rows, for each expert)."""
    experts, width, shared, hidden = (c.num_experts, c.moe_intermediate_size, c.shared_expert_intermediate_size,
                                      c.hidden_size)
    return {p + "gate.weight": (experts, hidden), p + "shared_expert_gate.weight": (1, hidden),
            p + "shared_expert.gate_proj.weight": (shared, hidden),
            p + "shared_expert.up_proj.weight": (shared, hidden),
            p + "shared_expert.down_proj.weight": (hidden, shared),
            p + "experts.gate_up_proj": (experts, 2 * width, hidden), p + "experts.down_proj": (experts, hidden, width)}


def canonical_name(name: str) -> str | None:
    """The canonical name of a stored tensor, or None for tensors the text model does not use."""
    if name.startswith(SKIPPED):
        return None
    for prefix, replacement in PREFIXES:
        if name.startswith(prefix):
            return replacement + name[len(prefix):]
    return name


def resolve(model: str, progress: bool = True) -> str:
    """A local folder, or the snapshot folder of a hub id (downloaded with a progress bar; offline if cached)."""
    if os.path.isdir(model):
        return model
    if model.count("/") != 1 or model.startswith((".", "/", "~")):
        raise CheckpointError(f"model {model!r}: no such folder, and not a hub id of the form owner/name")
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars
    patterns = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model"]
    try:
        return snapshot_download(model, allow_patterns=patterns, local_files_only=True)
    except Exception:  # noqa: BLE001, S110 (the hub fails in many ways here, and each means: not cached)
        pass
    (enable_progress_bars if progress else disable_progress_bars)()
    try:
        return snapshot_download(model, allow_patterns=patterns)
    except Exception as e:  # noqa: BLE001 (whatever failed, the message names it)
        raise CheckpointError(f"model {model!r}: cannot download from the hub ({type(e).__name__}: {e})") from None


def stored_tensors(folder: str) -> dict:
    """Every tensor in the folder's safetensors file(s), by stored name."""
    index = os.path.join(folder, "model.safetensors.index.json")
    weight_map = _weight_map(index) if os.path.lexists(index) else None
    if weight_map is not None:
        files = sorted(set(weight_map.values()))
    else:
        files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: no .safetensors files (tensorfold reads safetensors only)")
    tensors = {}
    for file in files:
        path = os.path.join(folder, file)
        if file in ("", ".", "..") or os.path.basename(file) != file or not os.path.lexists(path):
            raise CheckpointError(f"{folder}: the index names shard {file!r}, which is not in the folder")
        for name, info in read_header(path).items():
            if name in tensors:
                raise CheckpointError(f"tensor {name} is stored twice ({tensors[name].path} and {path})")
            tensors[name] = info
    if weight_map is not None:
        for name, file in weight_map.items():
            if name not in tensors or os.path.basename(tensors[name].path) != file:
                raise CheckpointError(f"tensor {brief(name)}: {index} places it in {brief(file)}, but that shard "
                                      f"lacks it")
    return tensors


def _weight_map(index: str) -> dict[str, str]:
    """The index's map of tensor name to shard file name."""
    weight_map = read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index}: weight_map must be an object of tensor name to shard file, got "
                              f"{brief(weight_map)}")
    for name, file in weight_map.items():
        if not isinstance(file, str):
            raise CheckpointError(f"{index}: weight_map[{brief(name)}] must be a shard file name, got {brief(file)}")
    return weight_map


def _float(info) -> np.ndarray:
    """A float tensor as float32, whatever its stored float dtype."""
    if info.dtype not in FLOAT_DTYPES:
        raise CheckpointError(f"tensor {info.name}: dtype {info.dtype}, expected one of {', '.join(FLOAT_DTYPES)}")
    values = info.read()
    return bf16_to_f32(values) if info.dtype == "BF16" else values.astype(np.float32)


def _linear(name, shape, found, config) -> Linear:
    """A Linear (or embedding) weight, dense or affine-quantized; quantized iff `<module>.scales` exists. A stack
    of experts [experts, out, in] becomes one Linear [experts * out, in]."""
    *stack, out_features, in_features = shape
    weight = found[name]
    module = name.removesuffix(".weight")
    scales, biases = found.get(module + ".scales"), found.get(module + ".biases")
    if scales is None:
        if biases is not None:
            raise CheckpointError(f"tensor {biases.name}: biases without scales")
        if weight.shape != shape:
            raise CheckpointError(f"tensor {weight.name}: shape {list(weight.shape)}, expected {list(shape)}")
        rows = math.prod(shape[:-1])
        if weight.dtype == "BF16":
            return Linear("bf16", rows, in_features, weight.read().reshape(rows, in_features))
        return Linear("f32", rows, in_features, _float(weight).reshape(rows, in_features))
    if biases is None:
        raise CheckpointError(f"tensor {scales.name}: scales without biases (only affine quantization is supported)")
    if config.quantization is None:
        raise CheckpointError(f"tensor {scales.name}: the weight is quantized but config.json has no quantization")
    spec = config.quantization.spec_for(weight.name.removesuffix(".weight"))
    bits, group = spec.bits, spec.group_size
    if in_features % group:
        raise CheckpointError(f"tensor {weight.name}: in_features {in_features} is not a multiple of group_size {group}")
    packed_shape = (*stack, out_features, in_features * bits // 32)
    if weight.dtype != "U32" or weight.shape != packed_shape:
        raise CheckpointError(f"tensor {weight.name}: {weight.dtype} {list(weight.shape)}, expected U32 "
                              f"{list(packed_shape)} for {bits}-bit weights of shape {list(shape)}")
    for part in (scales, biases):
        if part.shape != (*stack, out_features, in_features // group):
            raise CheckpointError(f"tensor {part.name}: shape {list(part.shape)}, expected "
                                  f"{[*stack, out_features, in_features // group]} (group_size {group})")
    rows = math.prod(shape[:-1])
    flat = lambda a: a.reshape(rows, a.shape[-1])  # noqa: E731 (an expert stack's experts one after another)
    scale_values, bias_values = _float(scales), _float(biases)
    for part, values, most in zip((scales, biases), (scale_values, bias_values), exact_factor_bits(bits, group)):
        _check_exact_factor(part, values, most)
    return Linear("affine", rows, in_features, flat(weight.read()), flat(scale_values), flat(bias_values), bits, group)


def _check_exact_factor(info, values, most: int) -> None:
    """Refuse float32 scales or biases with more significant bits than the exact GEMM multiplies exactly
    (quantize.exact_factor_bits): its GPU kernel and its CPU twin would round their sums differently. bf16 and
    float16 values always fit."""
    if info.dtype != "F32" or values.size == 0:
        return
    widest = int(significant_bits(values).max())
    if widest > most:
        raise CheckpointError(f"tensor {info.name}: float32 values with up to {widest} significant bits, where "
                              f"{most} at most keep the affine GEMM exact; store them as bf16 or "
                              f"float16, as MLX does for bf16 and float16 models")


def load_weights(folder: str, config: ModelConfig, progress: bool = False) -> dict:
    """All weights of the text model by canonical name: Linear for matrices, float32 arrays for the rest.

    Norm weights come back as the multiplier the norm applies (`1 + w` for centred HF norms), conv weights as
    [C, K]. With `progress`, a bar on stderr counts the tensors read.
    """
    stored = stored_tensors(folder)
    shapes = expected_shapes(config)
    found = {}
    for name, info in stored.items():
        canonical = canonical_name(name)
        if canonical is None or (canonical == "lm_head.weight" and config.tie_word_embeddings):
            continue  # vision, MTP, or an lm_head a tied model ignores
        if canonical in found:
            raise CheckpointError(f"tensor {name}: stored twice under different prefixes")
        found[canonical] = info
    if config.is_moe:
        gather_experts(found, config)
    quantized_parts = {n for n in found if n.endswith((".scales", ".biases"))}
    for name, info in found.items():
        if name not in shapes and name not in quantized_parts:
            raise CheckpointError(f"unexpected tensor {info.name}: not part of this model's config")
        module = name.rsplit(".", 1)[0]
        if name in quantized_parts and module + ".weight" not in shapes and module not in shapes:
            raise CheckpointError(f"unexpected tensor {info.name}: not part of this model's config")
    for name in shapes:
        if name not in found:
            raise CheckpointError(f"missing tensor {name} (expected shape {list(shapes[name])})")
    mlx_layout = None
    weights = {}
    names = shapes.items()
    if progress:
        from tqdm import tqdm
        names = tqdm(names, desc="loading", unit=" tensors", total=len(shapes))
    for name, shape in names:
        info = found[name]
        if len(shape) == 2 or ".experts." in name:
            weights[name] = _linear(name, shape, found, config)
            continue
        if name.endswith(("scales", "biases")):
            continue
        if name.endswith("conv1d.weight"):
            c, _, k = shape
            layout = {(c, 1, k): False, (c, k, 1): True}.get(info.shape)
            if layout is None or (mlx_layout is not None and layout != mlx_layout):
                raise CheckpointError(f"tensor {info.name}: shape {list(info.shape)}, expected {[c, 1, k]} (HF) "
                                      f"or {[c, k, 1]} (MLX)")
            mlx_layout = layout
            weights[name] = _float(info).reshape(c, k)
            continue
        if info.shape != shape:
            raise CheckpointError(f"tensor {info.name}: shape {list(info.shape)}, expected {list(shape)}")
        weights[name] = _float(info)
    if mlx_layout is None:  # no DeltaNet layer to tell: MLX files are the quantized or language_model.-named ones
        mlx_layout = config.quantization is not None or any(n.startswith("language_model.") for n in stored)
    if not mlx_layout:  # MLX files already hold 1 + w
        for name, value in weights.items():
            if name == "norm.weight" or name.endswith(CENTRED_NORMS):
                weights[name] = (np.float32(1.0) + value).astype(np.float32)
    return weights
