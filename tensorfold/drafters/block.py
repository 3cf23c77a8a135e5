"""The DFlash block drafter: a small Qwen3-style stack that reads the target's hidden states and guesses a whole block
of next tokens in one forward pass.

* Context. For every committed target row, the outputs of the target's decoder layers `target_layer_ids` (F arrays
  of H values) become one row `c = hidden_norm(fc([f_0 | ... | f_F-1]))`, and each drafter layer keeps
  `K = RoPE(k_norm(k_proj(c)))` at the row's position and `V = v_proj(c)`. Context rows are never queries.
* A block. The ids `[root, mask, ..., mask]` at positions P .. P + rows - 1 are embedded with the target's embedding
  and go through the layers (RMSNorm, attention, residual add, RMSNorm, SwiGLU MLP, residual add); every block row
  attends to every context row and every block row (bidirectional inside the block). The drafter's final norm and
  the target's lm_head give logits for rows 1 .. rows - 1: row i guesses the token at position P + i.

The drafter's norms are the plain Qwen3 form `x * rsqrt(mean(x^2) + eps) * w` (its stored weights are the
multipliers, unlike the target's `1 + w`); its RoPE is rotate-half over the whole head at its own theta. Every op runs
on the target's backend. `BlockDrafter` turns the block's logits into a chain (each row's argmax) or a tree
(best-first over each row's top k).
"""
import dataclasses
import math
import os

import numpy as np

from tensorfold.cuda.topk import MAX_K
from tensorfold.drafters.base import Drafter
from tensorfold.errors import CheckpointError, ConfigError, TensorfoldError
from tensorfold.model.checkpoint import FLOAT_DTYPES, Linear, resolve, stored_tensors
from tensorfold.model.config import ModelConfig, _check_positive_int, _is_int, _is_number, _require
from tensorfold.model.files import read_json_object
from tensorfold.drafters.replay import DraftGraphs, block_table, extend_table
from tensorfold.drafters.trees import best_first_tree
from tensorfold.model.replay import replays_decode_rounds
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


# --- the checkpoint ---------------------------------------------------------------------------------------------------

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
        info, values = stored[name], stored[name].read()
        if len(shape) == 2 and info.dtype == "BF16":
            weights[name] = Linear("bf16", *shape, values)
            continue
        values = bf16_to_f32(values) if info.dtype == "BF16" else values.astype(np.float32)
        weights[name] = Linear("f32", *shape, values) if len(shape) == 2 else values
    return weights


# --- the model --------------------------------------------------------------------------------------------------------

HEADROOM = 256  # context rows a drafter's buffers start with; full, they double (reserve_rows)


class DraftContext:
    """One stream's drafter cache: per drafter layer, the keys and values [rows, Hkv, Dh] of its context rows, and
    the absolute position of each context row (the first may be any position, e.g. after a prompt-cache resume).

    The buffers are backend arrays, empty at first, then of HEADROOM rows at least, doubled when full
    (`DFlashModel.reserve`), so they keep their identity for many rounds: a recorded proposal or extend
    (drafters/replay.py) is keyed by it. Rows past `length` hold the last block's or the last extend's and are
    overwritten by the next one."""

    def __init__(self, config: DFlashConfig, ops):
        shape = (0, config.num_key_value_heads, config.head_dim)
        self.keys = [ops.zeros(shape) for _ in range(config.num_hidden_layers)]
        self.values = [ops.zeros(shape) for _ in range(config.num_hidden_layers)]
        self.positions = np.zeros(0, np.int64)

    @property
    def length(self) -> int:
        return len(self.positions)

    @property
    def next_position(self) -> int:
        """The position after the last context row (0 for an empty context)."""
        return int(self.positions[-1]) + 1 if self.length else 0

    def buffers(self) -> list:
        """Every layer's key and value buffer: what a recording over this context launches on."""
        return [*self.keys, *self.values]

    def commit(self, position: int, rows: int) -> None:
        """The `rows` rows written at the context's end become context rows, at positions position on."""
        self.positions = np.concatenate([self.positions, position + np.arange(rows)])


@dataclasses.dataclass
class SavedContext:
    """A DraftContext's committed rows in host memory (what BlockDrafter.save returns)."""
    keys: list
    values: list
    positions: np.ndarray

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in [*self.keys, *self.values, self.positions])


def column_blocks(weight: Linear, width: int) -> list:
    """A dense Linear [out, F * width] as F Linears [out, width], one per block of columns."""
    assert weight.kind in ("f32", "bf16") and weight.in_features % width == 0
    return [dataclasses.replace(weight, in_features=width, data=np.ascontiguousarray(weight.data[:, a:a + width]))
            for a in range(0, weight.in_features, width)]


class DFlashModel:
    """The drafter on its target's backend, with the target's embedding and lm_head."""

    def __init__(self, config: DFlashConfig, weights: dict, target):
        config.check_target(target.config)
        self.config, self.ops = config, target.net.ops
        self.embedding, self.lm_head = target.net.weights["embed_tokens.weight"], target.net.lm_head
        # fc applies to [f_0 | ... | f_F-1], which no backend op builds; fc(concat) is the sum of each column block
        # applied to its feature, and extend adds them in tap order, so every backend gets the same bits.
        self.fc_blocks = [self.ops.upload(block) for block in column_blocks(weights["fc.weight"], config.hidden_size)]
        self.weights = {name: self.ops.upload(w) for name, w in weights.items() if name != "fc.weight"}

    def new_context(self) -> DraftContext:
        return DraftContext(self.config, self.ops)

    def reserve(self, context: DraftContext, rows: int) -> None:
        """Room for `rows` rows past the context's end in every layer's buffers (eager: it may grow them)."""
        needed = max(context.length + rows, HEADROOM)
        context.keys = [self.ops.reserve_rows(k, context.length, needed) for k in context.keys]
        context.values = [self.ops.reserve_rows(v, context.length, needed) for v in context.values]

    def keys_values(self, x, i, positions):
        """Layer i's keys (normed, roped at `positions`) and values of rows x [rows, Hd]."""
        c, ops, w = self.config, self.ops, self.weights
        a, rows = f"layers.{i}.self_attn.", x.shape[0]
        k = ops.linear(x, w[a + "k_proj.weight"]).reshape(rows, c.num_key_value_heads, c.head_dim)
        k = ops.rope(ops.rmsnorm(k, w[a + "k_norm.weight"], c.rms_norm_eps), positions, c.head_dim, c.rope_theta)
        v = ops.linear(x, w[a + "v_proj.weight"]).reshape(rows, c.num_key_value_heads, c.head_dim)
        return k, v

    def extend(self, context: DraftContext, features: list, position: int) -> None:
        """Append n committed rows at positions position .. position + n - 1 to the context; `features` holds the F
        tapped target layer outputs [n, H], in target_layer_ids order."""
        rows = features[0].shape[0]
        assert len(features) == self.config.num_taps, f"{len(features)} feature arrays for {self.config.num_taps} taps"
        assert position >= context.next_position, f"rows at {position} would go before the context's end"
        self.reserve(context, rows)
        self.write_context(context, features, self.ops.upload(extend_table(context.length, position, rows)))
        context.commit(position, rows)

    def write_context(self, context: DraftContext, features: list, table) -> None:
        """Each row's keys and values, from its tapped features, written into every layer's buffers: roped at
        positions table[0], at cache rows table[1] (extend_table, on the backend). A row's keys and values depend
        on its own features alone."""
        c, ops = self.config, self.ops
        positions, write_at = table[0], table[1]
        projected = ops.linear(features[0], self.fc_blocks[0])
        for feature, block in zip(features[1:], self.fc_blocks[1:]):
            projected = ops.add(projected, ops.linear(feature, block))
        hidden = ops.rmsnorm(projected, self.weights["hidden_norm.weight"], c.rms_norm_eps)
        for i in range(c.num_hidden_layers):
            ops.kv_write(context.keys[i], context.values[i], *self.keys_values(hidden, i, positions), write_at)

    def block_logits(self, context: DraftContext, root_id: int, rows: int, position: int | None = None):
        """Backend logits [rows - 1, V] of the block [root, mask * (rows - 1)] whose root sits at `position` (by
        default the position after the context's last row): row i guesses the token at position + i + 1."""
        start = context.next_position if position is None else position
        assert rows >= 2 and start >= context.next_position, f"a block of {rows} rows at {start}"
        self.reserve(context, rows)
        table = block_table(context.length, root_id, self.config.mask_token_id, rows, start)
        return self.block(context, self.ops.upload(table), context.length + rows)

    def block(self, context: DraftContext, table, max_keys: int):
        """block_logits over the block's integers on the backend (block_table), its attention's partials holding
        chunks for `max_keys` keys (a recording's: the whole buffer, whatever the context's length)."""
        c, ops, w = self.config, self.ops, self.weights
        ids, positions, n_keys, write_at = (table[n] for n in range(4))
        h = ops.embed(ids, self.embedding)
        for i in range(c.num_hidden_layers):
            p = f"layers.{i}."
            x = ops.rmsnorm(h, w[p + "input_layernorm.weight"], c.rms_norm_eps)
            h = ops.add(h, self.attention(x, context, i, positions, n_keys, write_at, max_keys))
            x = ops.rmsnorm(h, w[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
            h = ops.add(h, self.mlp(x, p + "mlp."))
        return ops.linear(ops.rmsnorm(h[1:], w["norm.weight"], c.rms_norm_eps), self.lm_head)

    def attention(self, x, context: DraftContext, i, positions, n_keys, write_at, max_keys):
        """Every block row reads every context row and every block row: the block's keys and values go right after
        the context in layer i's buffers (rows `write_at`; the next extend overwrites them) and every row reads up to
        their end (`n_keys`)."""
        c, ops, w = self.config, self.ops, self.weights
        a, rows = f"layers.{i}.self_attn.", x.shape[0]
        q = ops.linear(x, w[a + "q_proj.weight"]).reshape(rows, c.num_attention_heads, c.head_dim)
        q = ops.rope(ops.rmsnorm(q, w[a + "q_norm.weight"], c.rms_norm_eps), positions, c.head_dim, c.rope_theta)
        ops.kv_write(context.keys[i], context.values[i], *self.keys_values(x, i, positions), write_at)
        partial = ops.attention_partial(q, context.keys[i], context.values[i], n_keys, 1.0 / math.sqrt(c.head_dim),
                                        max_keys=max_keys)
        out = ops.attention_merge(*partial).reshape(rows, c.num_attention_heads * c.head_dim)
        return ops.linear(out, w[a + "o_proj.weight"])

    def mlp(self, x, p):
        ops, w = self.ops, self.weights
        gate, up = ops.linear(x, w[p + "gate_proj.weight"]), ops.linear(x, w[p + "up_proj.weight"])
        return ops.linear(ops.silu_mul(gate, up), w[p + "down_proj.weight"])


# --- drafting ---------------------------------------------------------------------------------------------------------

class BlockDrafter(Drafter):
    """The drafter an engine calls: per stream a DraftContext that `observe` extends with committed rows, and one
    block forward per proposal. Chains take each row's argmax, trees a best-first tree over each row's top k.

    `rows` is the block height (the root and up to rows - 1 guesses), the checkpoint's block_size by default.
    `chain_first` starts a tree from the whole top-1 chain (never fewer tokens accepted than the chain), but a budget
    of the whole block then leaves no room and the tree is the chain; so it is off by default: best-first alone
    trades the chain's deep, unlikely guesses for likelier siblings near the root.

    On a backend that records CUDA graphs, proposals and extends replay from recordings (drafters/replay.py), unless
    `graphs` is False, or None with TENSORFOLD_GRAPHS=0 (the engine's switch, model.replay.replays_decode_rounds).
    """

    name = "dflash"

    def __init__(self, model: DFlashModel, shape: str = "chain", rows: int | None = None, chain_first: bool = False,
                 graphs: bool | None = None):
        rows = model.config.block_size if rows is None else rows
        if shape not in ("tree", "chain"):
            raise TensorfoldError(f"drafter shape {shape!r}: choose 'tree' or 'chain'")
        if not _is_int(rows) or not 2 <= rows <= model.config.block_size:
            raise TensorfoldError(f"drafter rows must be between 2 and the block size {model.config.block_size}, "
                                  f"got {rows!r}")
        self.model, self.shape, self.rows, self.chain_first = model, shape, rows, chain_first
        self.taps = tuple(model.config.target_layer_ids)
        self.graphs = DraftGraphs(model) if replays_decode_rounds(model.ops, graphs) else None

    @property
    def recordings(self) -> int:
        return self.graphs.recorded if self.graphs is not None else 0

    def new_stream(self) -> DraftContext:
        return self.model.new_context()

    def reset(self, state: DraftContext) -> DraftContext:
        """The context emptied in its own buffers (no row is read past its length), whose recordings then replay."""
        state.positions = np.zeros(0, np.int64)
        return state

    def observe(self, state: DraftContext, features: list, position: int, rows: int | None = None) -> None:
        """Committed rows at positions position .. position + rows - 1, with their tapped features [n, H] each (the
        first `rows` of the n; all of them by default)."""
        rows = features[0].shape[0] if rows is None else rows
        if self.graphs is not None and self.graphs.fits(features):
            self.graphs.extend(state, features, position, rows)
        else:
            self.model.extend(state, [f[:rows] for f in features] if rows < features[0].shape[0] else features,
                              position)

    def save(self, state: DraftContext) -> "SavedContext":
        """The context's rows on the host: a prompt-cache snapshot keeps them, so a resumed stream drafts as well as
        a fresh one."""
        ops, n = self.model.ops, state.length
        return SavedContext([ops.to_host(k[:n]).copy() for k in state.keys],
                            [ops.to_host(v[:n]).copy() for v in state.values], state.positions.copy())

    def restore(self, saved: "SavedContext | None", into: DraftContext | None = None) -> DraftContext:
        context = self.new_stream() if into is None else self.reset(into)  # into: a lane's (its recordings replay)
        if saved is not None:  # the saved rows written into its buffers, grown where they must
            context.keys = [self.model.ops.append_rows(b, 0, k) for b, k in zip(context.keys, saved.keys)]
            context.values = [self.model.ops.append_rows(b, 0, v) for b, v in zip(context.values, saved.values)]
            context.positions = saved.positions.copy()
        return context

    def stream_bytes(self, rows: int) -> int:
        """A context of `rows` rows (keys and values of every drafter layer, float32) and the block past it."""
        c = self.model.config
        return 4 * 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * (rows + c.block_size)

    def block_topk(self, tokens: list, guesses: int, k: int, state: DraftContext) -> tuple:
        """Host (ids, log-probabilities) [guesses, k]: the top k of each of `guesses` block rows after the root
        tokens[-1], which sits at position len(tokens) - 1."""
        root, rows, start = tokens[-1], guesses + 1, len(tokens) - 1
        if self.graphs is not None:
            return self.graphs.propose(state, root, rows, start, k)
        return self.model.ops.topk(self.model.block_logits(state, root, rows, position=start), k)

    def propose(self, tokens: list, max_rows: int, state: DraftContext) -> list:
        """Up to min(max_rows, rows - 1) guesses following the root tokens[-1]: each block row's argmax. The block is
        always `rows` high, however few guesses are wanted: one shape, one recorded proposal."""
        guesses = min(max_rows, self.rows - 1)
        if guesses <= 0:
            return []
        ids, _ = self.block_topk(tokens, self.rows - 1, 1, state)
        return [int(i) for i in ids[:guesses, 0]]

    def propose_tree(self, tokens: list, max_rows: int, state: DraftContext) -> tuple:
        """(ids, parents) of up to min(max_rows, rows - 1) guesses; parents[i] is the guess that guess i follows, or
        -1 for the root. A chain drafter returns its chain."""
        budget = min(max_rows, self.rows - 1)
        if self.shape == "chain" or budget <= 0:
            return super().propose_tree(tokens, max_rows, state)  # the chain `propose` gives
        k = min(self.rows - 1, MAX_K, self.model.config.vocab_size)  # the block and k fixed, as in `propose`
        ids, logprobs = self.block_topk(tokens, self.rows - 1, k, state)
        return best_first_tree(logprobs[:budget], ids[:budget], budget, self.chain_first)


def load_dflash(path: str, target, progress=None) -> DFlashModel:
    """A DFlash drafter for `target` (a loaded tensorfold Model) from a folder or hub id; `progress`: show bars."""
    folder = resolve(str(path), progress=bool(progress))
    config = DFlashConfig.from_file(os.path.join(folder, "config.json"))
    config.check_target(target.config)  # before the tensors, whose shapes assume a matching target
    return DFlashModel(config, load_dflash_weights(folder, config, progress), target)


def load_drafter(path: str, target, progress=None, shape: str = "chain", rows: int | None = None,
                 graphs: bool | None = None) -> BlockDrafter:
    """load_dflash wrapped in a BlockDrafter (`graphs`: its switch for recordings)."""
    return BlockDrafter(load_dflash(path, target, progress), shape, rows, graphs=graphs)
