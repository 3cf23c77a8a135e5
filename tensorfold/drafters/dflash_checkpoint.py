"""A DFlash drafter's checkpoint: its `config.json` (`DFlashConfig`, validated, with DFlash2 and the variants not
implemented refused by name) and its tensors (`expected_shapes`, `load_dflash_weights`). The model they make is
block.py's."""
import dataclasses
import math
import os

import numpy as np

from tensorfold.errors import CheckpointError, ConfigError
from tensorfold.model.checkpoint import FLOAT_DTYPES, Linear, stored_tensors
from tensorfold.model.config import ModelConfig, _check_positive_int, _is_int, _is_number, _require
from tensorfold.model.files import read_json_object
from tensorfold.numerics.formats import bf16_to_f32

DFLASH2_TENSORS = ("candidate_selector.", ".attention_conv.", "mlp_conv.", "output_multiplier",
                   "final_logit_softcapping")  # names (or parts of names) only DFlash2 checkpoints hold
DFLASH2_FIELDS = ("output_multiplier", "final_logit_softcapping")  # config fields only DFlash2 configs set
DFLASH2_MESSAGE = "a DFlash2 drafter (DFlash2DraftModel), a different model that tensorfold does not run"
_POSITIVE_INTS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                  "intermediate_size", "vocab_size", "num_target_layers")


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple:
    """The taps a config without ids gets: the middle layer for one drafter layer, else evenly spaced from layer 1
    to layer num_target_layers - 3 (Python's round, as the reference computes them)."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    span = num_target_layers - 4
    return tuple(round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers))


@dataclasses.dataclass(frozen=True)
class DFlashConfig:
    """A DFlash drafter's `config.json`, validated on construction (and against its target by `check_target`)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_target_layers: int
    target_layer_ids: tuple
    mask_token_id: int
    block_size: int
    rms_norm_eps: float
    rope_theta: float

    def __post_init__(self):
        for name in _POSITIVE_INTS:  # before any division below: a zero count is reported as such
            _check_positive_int(name, getattr(self, name))
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                              f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even (RoPE rotates pairs), got {self.head_dim}")
        if not _is_int(self.block_size) or self.block_size < 2:
            raise ConfigError(f"block_size must be an integer of at least 2 (the root and one guess), got "
                              f"{self.block_size!r}")
        for name in ("rms_norm_eps", "rope_theta"):
            if not _is_number(getattr(self, name)) or not 0 < getattr(self, name) < math.inf:
                raise ConfigError(f"{name} must be a positive number, got {getattr(self, name)!r}")
            object.__setattr__(self, name, float(getattr(self, name)))  # JSON may spell 1e6 as an integer
        ids = self.target_layer_ids
        if not ids or not all(_is_int(i) for i in ids):
            raise ConfigError(f"target_layer_ids must be a non-empty list of integers, got {list(ids)!r}")
        if list(ids) != sorted(set(ids)):
            raise ConfigError(f"target_layer_ids must be sorted and unique, got {list(ids)}")
        for n, i in enumerate(ids):
            if not 0 <= i < self.num_target_layers:
                raise ConfigError(f"target_layer_ids[{n}] is {i}, outside the target's layers 0 .. "
                                  f"{self.num_target_layers - 1} (num_target_layers {self.num_target_layers})")
        if not _is_int(self.mask_token_id) or not 0 <= self.mask_token_id < self.vocab_size:
            raise ConfigError(f"mask_token_id must be a token id below vocab_size ({self.vocab_size}), got "
                              f"{self.mask_token_id!r}")

    @property
    def num_taps(self) -> int:
        """F: how many target layers feed the drafter."""
        return len(self.target_layer_ids)

    def check_target(self, target: ModelConfig) -> None:
        """Refuse a target this drafter was not built for: its layers, hidden size and vocabulary must match."""
        if self.num_target_layers != target.num_hidden_layers:
            raise ConfigError(f"num_target_layers is {self.num_target_layers}, but the target has "
                              f"{target.num_hidden_layers} layers")
        if self.hidden_size != target.hidden_size:
            raise ConfigError(f"hidden_size is {self.hidden_size}, but the target's is {target.hidden_size}: the "
                              f"block is embedded with the target's embedding, so they must be equal")
        if self.vocab_size != target.vocab_size:
            raise ConfigError(f"vocab_size is {self.vocab_size}, but the target's is {target.vocab_size}")

    @classmethod
    def from_dict(cls, d: dict) -> "DFlashConfig":
        """Parse a z-lab DFlash `config.json` dict; refuse DFlash2 and the variants not implemented here."""
        if not isinstance(d, dict):
            raise ConfigError(f"config.json must hold a JSON object, got {type(d).__name__}")
        draft = d.get("dflash_config") or {}
        if not isinstance(draft, dict):
            raise ConfigError(f"dflash_config must be a JSON object, got {draft!r}")
        architectures = d.get("architectures") or []
        if "DFlash2DraftModel" in architectures or any(level.get(name) is not None for level in (d, draft)
                                                        for name in DFLASH2_FIELDS):
            raise ConfigError(f"this config describes {DFLASH2_MESSAGE}")
        if architectures and not any("DFlash" in name for name in architectures):
            raise ConfigError(f"architectures {architectures} is not a DFlash drafter (expected DFlashDraftModel)")
        _refuse_variants(d, draft)

        def draft_field(name, default=None):  # dflash_config first, then the top level (checkpoints differ)
            return draft[name] if draft.get(name) is not None else d.get(name, default)

        for name in ("num_hidden_layers", "num_target_layers"):
            _check_positive_int(name, _require(d, name))
        ids = draft_field("target_layer_ids")
        if ids is None:
            ids = default_target_layer_ids(d["num_target_layers"], d["num_hidden_layers"])
        if not isinstance(ids, (list, tuple)):
            raise ConfigError(f"target_layer_ids must be a list of integers, got {ids!r}")
        rope = d.get("rope_parameters") or {}
        mask_token_id = draft_field("mask_token_id")
        if mask_token_id is None:
            raise ConfigError("config.json is missing required field mask_token_id (in dflash_config or at the top)")
        return cls(**{name: _require(d, name) for name in _POSITIVE_INTS}, target_layer_ids=tuple(ids),
                   mask_token_id=mask_token_id, block_size=draft_field("block_size", 16),
                   rms_norm_eps=d.get("rms_norm_eps", 1e-6),
                   rope_theta=rope.get("rope_theta", d.get("rope_theta", 10000.0)))

    @classmethod
    def from_file(cls, path) -> "DFlashConfig":
        """Read a drafter's `config.json`, given its path or the folder holding it; a refusal names the file."""
        path = os.path.join(path, "config.json") if os.path.isdir(path) else path
        fields = read_json_object(path, error=ConfigError)
        try:
            return cls.from_dict(fields)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None


def _refuse_variants(d: dict, draft: dict) -> None:
    """What we implement: every layer full attention, bidirectional inside the block, plain RoPE, SiLU, no biases."""
    causal = draft.get("causal", d.get("is_causal"))
    if causal:
        raise ConfigError(f"a causal drafter (causal {causal!r}) is not supported: only bidirectional blocks are")
    layer_types = d.get("layer_types") or []
    for i, kind in enumerate(layer_types):
        if kind != "full_attention":
            raise ConfigError(f"layer_types[{i}] is {kind!r}: only full_attention drafter layers are supported")
    if (not layer_types and d.get("use_sliding_window")) or draft.get("use_swa"):
        raise ConfigError("a sliding-window drafter (use_sliding_window / dflash_config.use_swa) is not supported")
    rope_type = (d.get("rope_parameters") or {}).get("rope_type", "default")
    if rope_type != "default":
        raise ConfigError(f"rope_parameters.rope_type {rope_type!r} is not supported; only 'default' is")
    scaling = d.get("rope_scaling") or {}
    scaling_type = scaling.get("rope_type", scaling.get("type", "default"))
    if scaling_type != "default":
        raise ConfigError(f"rope_scaling type {scaling_type!r} is not supported; only 'default' is")
    if d.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"hidden_act {d['hidden_act']!r} is not supported; only 'silu' is")
    if d.get("attention_bias"):
        raise ConfigError(f"attention_bias {d['attention_bias']!r} is not supported; drafter projections have no bias")
    if draft.get("input_embedding_scale", 1.0) != 1.0:
        raise ConfigError(f"dflash_config.input_embedding_scale {draft['input_embedding_scale']!r} is not supported "
                          f"(only 1.0)")


# --- the tensors ------------------------------------------------------------------------------------------------------

def expected_shapes(config: DFlashConfig) -> dict:
    """The 3 + 11 * L tensors of a drafter checkpoint with their shapes ([out, in] for matrices)."""
    c = config
    hd, q_width, kv_width = c.hidden_size, c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    shapes = {"fc.weight": (hd, c.num_taps * hd), "hidden_norm.weight": (hd,), "norm.weight": (hd,)}
    for i in range(c.num_hidden_layers):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (hd,), p + "post_attention_layernorm.weight": (hd,),
            p + "self_attn.q_proj.weight": (q_width, hd), p + "self_attn.k_proj.weight": (kv_width, hd),
            p + "self_attn.v_proj.weight": (kv_width, hd), p + "self_attn.o_proj.weight": (hd, q_width),
            p + "self_attn.q_norm.weight": (c.head_dim,), p + "self_attn.k_norm.weight": (c.head_dim,),
            p + "mlp.gate_proj.weight": (c.intermediate_size, hd), p + "mlp.up_proj.weight": (c.intermediate_size, hd),
            p + "mlp.down_proj.weight": (hd, c.intermediate_size)})
    return shapes


def load_dflash_weights(folder: str, config: DFlashConfig, progress=False) -> dict:
    """Every drafter tensor by name: Linear (bf16 or f32) for matrices, float32 arrays for the norm weights."""
    stored, shapes = stored_tensors(folder), expected_shapes(config)
    for name in stored:
        if any(part in name for part in DFLASH2_TENSORS):
            raise CheckpointError(f"tensor {name} belongs to {DFLASH2_MESSAGE}")
        if name not in shapes:
            raise CheckpointError(f"unexpected tensor {name}: not part of a DFlash drafter with this config")
    for name, shape in shapes.items():
        info = stored.get(name)
        if info is None:
            raise CheckpointError(f"missing tensor {name} (expected shape {list(shape)})")
        if info.shape != shape:
            why = f" ({config.num_taps} target layers x hidden size {config.hidden_size})" if "fc." in name else ""
            raise CheckpointError(f"tensor {name}: shape {list(info.shape)}, expected {list(shape)}{why}")
        if info.dtype not in FLOAT_DTYPES:
            raise CheckpointError(f"tensor {name}: dtype {info.dtype}, expected one of {', '.join(FLOAT_DTYPES)}")
    names = shapes.items()
    if progress:
        from tqdm import tqdm
        names = tqdm(names, desc="loading the drafter", unit=" tensors", total=len(shapes))
    weights = {}
    for name, shape in names:
        info = stored[name]
        values = info.read()
        if len(shape) == 2 and info.dtype == "BF16":
            weights[name] = Linear("bf16", *shape, values)
            continue
        values = bf16_to_f32(values) if info.dtype == "BF16" else values.astype(np.float32)
        weights[name] = Linear("f32", *shape, values) if len(shape) == 2 else values
    return weights
