"""The model config: the fields of a Qwen3.5 `config.json` that the engine runs on, checked once at load time.

Two layouts exist. Released checkpoints are composite (`model_type: "qwen3_5"`) with the language-model fields
under `text_config`; text-only saves are flat (`model_type: "qwen3_5_text"`, or a flat `"qwen3_5"`). Every field
is read from `text_config` first and from the top level as a fallback, so both layouts parse the same way.
MLX checkpoints add a top-level `quantization` block (copied as `quantization_config`).

The MoE family (`qwen3_5_moe`, text-only `qwen3_5_moe_text`) replaces every layer's MLP with the sparse block
(tensorfold/model/moe.py): `num_experts` experts of width `moe_intermediate_size`, `num_experts_per_tok` of them
chosen a row, and a shared expert of width `shared_expert_intermediate_size`. A dense config's four MoE sizes are
0; an MoE config's intermediate_size is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from tensorfold.errors import ConfigError
from tensorfold.model.files import read_json_object

LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"
DENSE_MODEL_TYPES = ("qwen3_5", "qwen3_5_text")
MOE_MODEL_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text")
MODEL_TYPES = DENSE_MODEL_TYPES + MOE_MODEL_TYPES

# The fields no default can stand in for: they fix the shape of every weight.
REQUIRED_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
)
DENSE_FIELDS = ("intermediate_size",)  # the dense MLP's width; an MoE config has no dense MLP
MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")
_POSITIVE_INTS = REQUIRED_FIELDS + ("linear_conv_kernel_dim", "max_position_embeddings")
# Bounds on the integer fields, checked before anything is built from them: the deepest released Qwen3.5 has 60
# layers and the widest MoE 512 experts, and no size of a real model comes near 2**31.
MAX_LAYERS = 1024
MAX_EXPERTS = 4096
MAX_SIZE = 2**31 - 1
_LIMITS = {"num_hidden_layers": MAX_LAYERS, "num_experts": MAX_EXPERTS, "num_experts_per_tok": MAX_EXPERTS}
# The fields `to_dict` writes under their own name, as `config.json` spells them (and the family's own).
_PLAIN_FIELDS = _POSITIVE_INTS + ("rms_norm_eps", "tie_word_embeddings")
_QUANT_GLOBAL_KEYS = ("bits", "group_size", "mode")


@dataclass(frozen=True)
class QuantSpec:
    """How one module's weight is quantized: `bits` per code, one scale and bias per `group_size` inputs."""

    bits: int
    group_size: int


@dataclass(frozen=True)
class Quantization:
    """The MLX `quantization` block: a global spec plus per-module overrides keyed by module path."""

    bits: int
    group_size: int
    mode: str = "affine"
    overrides: dict[str, QuantSpec] = field(default_factory=dict)

    def __post_init__(self):
        if self.mode != "affine":
            raise ConfigError(f"quantization mode {self.mode!r} is not supported; only 'affine' is")
        _check_quant_spec("quantization", self.bits, self.group_size)
        for path, spec in self.overrides.items():
            _check_quant_spec(f"quantization[{path!r}]", spec.bits, spec.group_size)

    def spec_for(self, module_path: str) -> QuantSpec:
        """The spec of the module at `module_path`: its override if it has one, else the global spec."""
        return self.overrides.get(module_path, QuantSpec(self.bits, self.group_size))

    def to_dict(self) -> dict:
        """The block as MLX writes it, overrides included."""
        block = {"bits": self.bits, "group_size": self.group_size, "mode": self.mode}
        for path, spec in self.overrides.items():
            block[path] = {"bits": spec.bits, "group_size": spec.group_size}
        return block


@dataclass(frozen=True)
class ModelConfig:
    """The language-model hyperparameters of a Qwen3.5 checkpoint, dense or MoE, validated on construction."""

    # As written at the top level; left out of `==` so that both layouts of one model compare equal.
    model_type: str = field(compare=False)
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    rms_norm_eps: float
    rope_theta: float
    partial_rotary_factor: float
    tie_word_embeddings: bool
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...]
    quantization: Quantization | None
    # The sparse block's sizes: all 0 for a dense model, all positive for an MoE one (then intermediate_size is 0).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0

    def __post_init__(self):
        for name in _POSITIVE_INTS + self.family_fields:
            _check_positive_int(name, getattr(self, name))
        for name in MOE_FIELDS if not self.is_moe else DENSE_FIELDS:
            if getattr(self, name) != 0:
                kind = "an MoE" if self.is_moe else "a dense"
                raise ConfigError(f"{name} is {getattr(self, name)!r}, but {kind} model has none: it must be 0")
        if self.is_moe and self.num_experts_per_tok > self.num_experts:
            raise ConfigError(f"num_experts_per_tok ({self.num_experts_per_tok}) must be at most num_experts "
                              f"({self.num_experts})")
        for name in ("rms_norm_eps", "rope_theta", "partial_rotary_factor"):
            value = getattr(self, name)
            if not _is_number(value) or not 0 < value < math.inf:
                raise ConfigError(f"{name} must be a positive number, got {value!r}")
            object.__setattr__(self, name, float(value))  # JSON may spell 1e7 as the integer 10000000
        if self.partial_rotary_factor > 1:
            raise ConfigError(f"partial_rotary_factor must be at most 1, got {self.partial_rotary_factor!r}")
        if not isinstance(self.tie_word_embeddings, bool):
            raise ConfigError(f"tie_word_embeddings must be true or false, got {self.tie_word_embeddings!r}")
        # Query heads share KV heads in groups (GQA), and DeltaNet value heads share q/k heads the same way.
        _check_multiple(self, "num_attention_heads", "num_key_value_heads")
        _check_multiple(self, "linear_num_value_heads", "linear_num_key_heads")
        if len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(
                f"layer_types has {len(self.layer_types)} entries but num_hidden_layers is {self.num_hidden_layers}"
            )
        for i, kind in enumerate(self.layer_types):
            if kind not in (LINEAR_ATTENTION, FULL_ATTENTION):
                raise ConfigError(f"layer_types[{i}] is {kind!r}; expected {LINEAR_ATTENTION!r} or {FULL_ATTENTION!r}")
        if not self.full_attention_layers:
            # Every released model has some, and the reference implementation fails without one.
            raise ConfigError(
                f"layer_types must include at least one {FULL_ATTENTION!r} layer, got {len(self.layer_types)} "
                f"{LINEAR_ATTENTION!r} layers"
            )
        if self.rotary_dim < 2 or self.rotary_dim % 2:  # rotation works on pairs of dims
            raise ConfigError(
                f"head_dim ({self.head_dim}) * partial_rotary_factor ({self.partial_rotary_factor}) gives rotary dim "
                f"{self.rotary_dim}; it must be even and at least 2"
            )
        for token_id in self.eos_token_ids:
            _check_token_id(token_id)

    @property
    def is_moe(self) -> bool:
        """Whether every layer's MLP is the sparse block (the MoE family)."""
        return self.model_type in MOE_MODEL_TYPES

    @property
    def family_fields(self) -> tuple[str, ...]:
        """The size fields of the MLP this family has: MOE_FIELDS or DENSE_FIELDS."""
        return MOE_FIELDS if self.is_moe else DENSE_FIELDS

    @property
    def rotary_dim(self) -> int:
        """How many leading dims of each query/key head are rotated (the rest pass through)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def conv_dim(self) -> int:
        """Channels of the DeltaNet causal conv: q and k (nk·dk each) then v (nv·dv)."""
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + (
            self.linear_num_value_heads * self.linear_value_head_dim
        )

    @property
    def full_attention_layers(self) -> tuple[int, ...]:
        """Indices of the full-attention layers, ascending."""
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == FULL_ATTENTION)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        """Parse a `config.json` dict of either layout."""
        if not isinstance(d, dict):
            raise ConfigError(f"config.json must hold a JSON object, got {type(d).__name__}")
        model_type = _require(d, "model_type")
        _check_model_type("model_type", model_type)
        text = d.get("text_config") or {}
        if not isinstance(text, dict):
            raise ConfigError(f"text_config must be a JSON object, got {text!r}")
        moe = model_type in MOE_MODEL_TYPES
        if "model_type" in text:
            _check_model_type("text_config.model_type", text["model_type"])
            if (text["model_type"] in MOE_MODEL_TYPES) != moe:
                raise ConfigError(f"text_config.model_type {text['model_type']!r} does not belong to model_type "
                                  f"{model_type!r}: one is an MoE type and the other dense")
        # text_config wins over the top level; a null value counts as absent.
        fields = {key: value for level in (d, text) for key, value in level.items() if value is not None}
        if moe:
            _check_sparse_layout(fields)
        rope_theta, partial_rotary_factor = _parse_rope(fields)
        return cls(
            model_type=model_type,
            **{name: _require(fields, name) for name in REQUIRED_FIELDS + (MOE_FIELDS if moe else DENSE_FIELDS)},
            **({"intermediate_size": 0} if moe else {}),
            layer_types=_parse_layer_types(fields),
            linear_conv_kernel_dim=fields.get("linear_conv_kernel_dim", 4),
            rms_norm_eps=fields.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            partial_rotary_factor=partial_rotary_factor,
            tie_word_embeddings=fields.get("tie_word_embeddings", False),
            max_position_embeddings=fields.get("max_position_embeddings", 262144),
            eos_token_ids=_parse_eos_token_ids(text, d),
            quantization=_parse_quantization(d),
        )

    @classmethod
    def from_file(cls, path) -> ModelConfig:
        """Read a `config.json`, given its path or the checkpoint directory holding it; a refusal names the file."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        fields = read_json_object(path, error=ConfigError)
        try:
            return cls.from_dict(fields)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None

    def to_dict(self) -> dict:
        """A flat `qwen3_5_text` (or `qwen3_5_moe_text`) `config.json` dict that `from_dict` and transformers both
        read back."""
        # mRoPE splits the rotary pairs over 3 position axes; text positions are equal on all three.
        half = self.rotary_dim // 2
        mrope_section = [half // 3 + (i < half % 3) for i in range(3)]
        d = {
            "architectures": ["Qwen3_5MoeForCausalLM" if self.is_moe else "Qwen3_5ForCausalLM"],
            "model_type": "qwen3_5_moe_text" if self.is_moe else "qwen3_5_text",
            **{name: getattr(self, name) for name in _PLAIN_FIELDS + self.family_fields},
            "layer_types": list(self.layer_types),
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
                "mrope_section": mrope_section,
                "mrope_interleaved": True,
            },
            "eos_token_id": list(self.eos_token_ids),
        }
        if self.quantization is not None:
            d["quantization"] = self.quantization.to_dict()
            d["quantization_config"] = self.quantization.to_dict()
        return d


def _check_sparse_layout(fields: dict) -> None:
    """Refuse the MoE options that would make some layers dense or leave the routed weights unnormalised: released
    Qwen3.5 MoE models have neither, and transformers' Qwen3_5Moe implements neither."""
    if fields.get("decoder_sparse_step", 1) != 1:
        raise ConfigError(f"decoder_sparse_step {fields['decoder_sparse_step']!r} is not supported; only 1 (every "
                          f"layer sparse) is")
    if fields.get("mlp_only_layers", []) != []:
        raise ConfigError(f"mlp_only_layers {fields['mlp_only_layers']!r} is not supported; only [] (no dense "
                          f"layer) is")
    if fields.get("norm_topk_prob", True) is not True:
        raise ConfigError(f"norm_topk_prob {fields['norm_topk_prob']!r} is not supported; only true (the chosen "
                          f"experts' weights renormalised) is")


def _parse_rope(fields: dict) -> tuple:
    """`rope_theta` and `partial_rotary_factor`, from `rope_parameters` or else the older top-level fields."""
    params = fields.get("rope_parameters", {})
    if not isinstance(params, dict):
        raise ConfigError(f"rope_parameters must be a JSON object, got {params!r}")
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise ConfigError(f"rope_parameters.rope_type {rope_type!r} is not supported; only 'default' is")
    scaling = fields.get("rope_scaling", {})
    if not isinstance(scaling, dict):
        raise ConfigError(f"rope_scaling must be a JSON object, got {scaling!r}")
    scaling_type = scaling.get("rope_type", scaling.get("type", "default"))
    if scaling_type != "default":
        raise ConfigError(f"rope_scaling type {scaling_type!r} is not supported; only 'default' is")
    # transformers' defaults; released models set rope_theta to 1e7.
    rope_theta = params.get("rope_theta", fields.get("rope_theta", 10000.0))
    partial_rotary_factor = params.get("partial_rotary_factor", fields.get("partial_rotary_factor", 0.25))
    return rope_theta, partial_rotary_factor


def _parse_layer_types(fields: dict) -> tuple:
    """The explicit `layer_types` list, or else the pattern `full_attention_interval` describes."""
    if "layer_types" in fields:
        layer_types = fields["layer_types"]
        if not isinstance(layer_types, list):
            raise ConfigError(f"layer_types must be a list, got {layer_types!r}")
        return tuple(layer_types)
    interval = fields.get("full_attention_interval", 4)
    _check_positive_int("full_attention_interval", interval)
    num_layers = fields["num_hidden_layers"]
    _check_positive_int("num_hidden_layers", num_layers)
    return tuple(FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(num_layers))


def _parse_eos_token_ids(*levels: dict) -> tuple:
    """Every `eos_token_id` (an int or a list) of the given levels, in order, without repeats."""
    ids = []
    for level in levels:
        value = level.get("eos_token_id")
        if value is not None:
            ids.extend(value if isinstance(value, list) else [value])
    for token_id in ids:
        _check_token_id(token_id)  # before dict.fromkeys, which needs hashable ids
    return tuple(dict.fromkeys(ids))


def _parse_quantization(d: dict) -> Quantization | None:
    """The top-level MLX quantization block, or None for a float checkpoint."""
    name = "quantization" if "quantization" in d else "quantization_config"
    block = d.get(name)
    if block is None:
        return None
    if not isinstance(block, dict):
        raise ConfigError(f"{name} must be a JSON object, got {block!r}")
    # GPTQ, AWQ, FP8 and the like declare a quant_method; MLX does not.
    if "quant_method" in block:
        raise ConfigError(f"{name}.quant_method {block['quant_method']!r} is not supported; only MLX quantization is")
    bits, group_size = _require(block, "bits", name), _require(block, "group_size", name)
    overrides = {}
    for path, entry in block.items():
        # A module key set to false (or true) just restates whether `<path>.scales` exists: nothing to record.
        if path in _QUANT_GLOBAL_KEYS or not isinstance(entry, dict):
            continue
        mode = entry.get("mode", "affine")
        if mode != "affine":
            raise ConfigError(f"{name}[{path!r}] mode {mode!r} is not supported; only 'affine' is")
        overrides[path] = QuantSpec(entry.get("bits", bits), entry.get("group_size", group_size))
    return Quantization(bits, group_size, block.get("mode", "affine"), overrides)


def _require(d: dict, key: str, where: str = "config.json"):
    if d.get(key) is None:
        raise ConfigError(f"{where} is missing required field {key}")
    return d[key]


def _check_model_type(name: str, model_type) -> None:
    if model_type in MODEL_TYPES:
        return
    raise ConfigError(f"{name} {model_type!r} is not supported; expected one of {MODEL_TYPES}")


def _check_quant_spec(where: str, bits, group_size) -> None:
    if not _is_int(bits) or bits not in (4, 8):
        raise ConfigError(f"{where} bits must be 4 or 8, got {bits!r}")
    if not _is_int(group_size) or group_size <= 0:
        raise ConfigError(f"{where} group_size must be a positive integer, got {group_size!r}")


def _check_positive_int(name: str, value) -> None:
    if not _is_int(value) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    limit = _LIMITS.get(name, MAX_SIZE)
    if value > limit:
        raise ConfigError(f"{name} must be at most {limit} (tensorfold's limit), got {value}")


def _check_token_id(token_id) -> None:
    if not _is_int(token_id) or not 0 <= token_id <= MAX_SIZE:
        raise ConfigError(f"eos_token_id must be an integer from 0 to {MAX_SIZE} or a list of them, got {token_id!r}")


def _check_multiple(config: ModelConfig, name: str, divisor_name: str) -> None:
    value, divisor = getattr(config, name), getattr(config, divisor_name)
    if value % divisor:
        raise ConfigError(f"{name} ({value}) must be a multiple of {divisor_name} ({divisor})")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true/false are ints in Python


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
