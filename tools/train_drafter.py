"""Train a DFlash block drafter for the tiny default model and export it in the z-lab DFlash checkpoint format.

Not part of the package: needs torch, transformers (with ``Qwen3_5ForCausalLM``) and safetensors. The target is
any checkpoint tensorfold loads (by default the embedded ``tensorfold/models/tiny-shakespeare``), dequantized to
float32 and run by transformers, frozen. The drafter (``DFlashDraft``) is a small Qwen3-style stack with no
embedding and no LM head of its own: block tokens are embedded with the target's embedding, outputs go through
the target's LM head, and its keys and values also come from the target's hidden states (KV injection).

Data is self-distillation: the drafter must predict what the target itself writes. Prompts cut from
``train.npy`` (uint16 token ids, as ``tools/prepare_shakespeare.py`` writes them) are continued by the target,
greedily and sampled (temperature 0.7 to 1.0), and raw corpus windows are added for real-text contexts. One target
forward then captures the tapped hidden states of every sequence. Each training step draws random anchors P in
each of a batch of sequences and predicts, for each anchor, the block [x_P, mask, ..., mask] against the labels
x_{P+1..P+15}, all anchors of a sequence in one attention call with a mask. The same mix cut from ``val.npy``
gives the validation loss (the best checkpoint is kept) and the acceptance length tau: tokens committed per round,
bonus included, of greedy chain drafting and of a best-first tree of 15 nodes against the target's greedy text.

Writes ``config.json``, ``model.safetensors`` (bf16), ``README.md`` and ``train_log.json``.

Choices, for a target of 8 layers of 256:
- The target runs in float32 (TF32 off), as in the engine, so the greedy text and the states the drafter learns
  from are the ones it will be given; at 8M parameters that costs little. The drafter trains under bf16 autocast
  on a GPU, with float32 master weights, and is evaluated from its bf16-rounded weights in float32.
- Taps target layers 1, 3, 5, 7: every other layer, both full-attention layers' outputs and the last layer's
  output among them (the spec's default for 2 drafter layers would tap only 1 and 5); `fc` stays small (1024 in).
- Depth k of the block weighs exp(-(k-1)/7) in the loss (DFlash's decay for blocks of 16): a draft at depth k
  counts only when depths 1..k-1 were accepted.
- 2 drafter layers, 4 query / 2 KV heads of 64, MLP 768, RoPE theta 10000 (contexts are a few thousand tokens at
  most), mask id 4094 (``<tool_call>``, a special token the plays never contain; checked at start).

Usage (one GPU, about 5 minutes in all: 4 of training, the rest loading, generating data and evaluating)::

    python tools/train_drafter.py --target tensorfold/models/tiny-shakespeare --data .artifacts/shakespeare \
        --out tensorfold/models/tiny-shakespeare/drafter --minutes 4
    python tools/train_drafter.py --data .artifacts/shakespeare --out /tmp/drafter --device cpu --minutes 0.5 \
        --sequences 192 --val-sequences 16 --seq-len 160 --seqs-per-step 8 --anchors 16
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import math
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from a checkout: use the package beside it
    sys.path.insert(0, str(REPO))


# ---------------------------------------------------------------------------------------------------------------
# The drafter


@dataclasses.dataclass
class DraftConfig:
    hidden_size: int
    vocab_size: int
    num_target_layers: int
    target_layer_ids: list
    mask_token_id: int
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 768
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    block_size: int = 16

    def to_json(self) -> dict:
        """The z-lab DFlash `config.json` (spec 1.6)."""
        return {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "layer_types": ["full_attention"] * self.num_hidden_layers,
            "attention_bias": False,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "num_target_layers": self.num_target_layers,
            "block_size": self.block_size,
            "dflash_config": {"target_layer_ids": list(self.target_layer_ids), "mask_token_id": self.mask_token_id},
            "torch_dtype": "bfloat16",
        }

    @classmethod
    def from_json(cls, config: dict) -> "DraftConfig":
        dflash = config["dflash_config"]
        return cls(
            hidden_size=config["hidden_size"],
            vocab_size=config["vocab_size"],
            num_target_layers=config["num_target_layers"],
            target_layer_ids=list(dflash["target_layer_ids"]),
            mask_token_id=dflash["mask_token_id"],
            num_hidden_layers=config["num_hidden_layers"],
            num_attention_heads=config["num_attention_heads"],
            num_key_value_heads=config["num_key_value_heads"],
            head_dim=config["head_dim"],
            intermediate_size=config["intermediate_size"],
            rms_norm_eps=config["rms_norm_eps"],
            rope_theta=config["rope_theta"],
            max_position_embeddings=config["max_position_embeddings"],
            block_size=config["block_size"],
        )


class RMSNorm(nn.Module):
    """Plain Qwen3 RMSNorm, `x * rsqrt(mean(x^2) + eps) * w` (not the target's `(1 + w)` form)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox (rotate-half) RoPE over the whole head: x [N, T, heads, D] at absolute positions [N, T]."""
    dim = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim)
    angles = positions.float()[..., None] * inv_freq
    cos = torch.cat([angles.cos(), angles.cos()], -1)[:, :, None, :]
    sin = torch.cat([angles.sin(), angles.sin()], -1)[:, :, None, :]
    x32 = x.float()
    rotated = torch.cat([-x32[..., dim // 2:], x32[..., : dim // 2]], -1)
    return (x32 * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    """Block queries over [context keys from c ; block keys], GQA, per-head q/k RMSNorm before RoPE."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.cfg = cfg
        hd, dh = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(hd, cfg.num_attention_heads * dh, bias=False)
        self.k_proj = nn.Linear(hd, cfg.num_key_value_heads * dh, bias=False)
        self.v_proj = nn.Linear(hd, cfg.num_key_value_heads * dh, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * dh, hd, bias=False)
        self.q_norm = RMSNorm(dh, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(dh, cfg.rms_norm_eps)

    def forward(self, x, c, block_positions, context_positions, attention_mask):
        cfg = self.cfg
        n, rows, _ = x.shape
        heads, kv_heads, dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim

        def keys(source, positions):
            k = self.k_norm(self.k_proj(source).view(n, source.shape[1], kv_heads, dh))
            return rope(k, positions, cfg.rope_theta)

        q = rope(self.q_norm(self.q_proj(x).view(n, rows, heads, dh)), block_positions, cfg.rope_theta)
        k = torch.cat([keys(c, context_positions), keys(x, block_positions)], 1)
        v = torch.cat([self.v_proj(c), self.v_proj(x)], 1).view(n, -1, kv_heads, dh)
        groups = heads // kv_heads
        q = q.transpose(1, 2)
        k = k.transpose(1, 2).repeat_interleave(groups, 1)
        v = v.transpose(1, 2).repeat_interleave(groups, 1)
        mask = None if attention_mask is None else attention_mask[:, None]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=dh**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(n, rows, heads * dh))


class MLP(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, c, block_positions, context_positions, attention_mask):
        x = x + self.self_attn(self.input_layernorm(x), c, block_positions, context_positions, attention_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraft(nn.Module):
    """The DFlash drafter (spec 1.1-1.3). Its parameter names are the checkpoint's tensor names (spec 1.6)."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, block_embeds, block_positions, context_features, context_positions, attention_mask=None):
        """Final-normed hidden states of the block rows.

        block_embeds [N, Q, Hd] (target-embedded block tokens) at block_positions [N, Q]; context_features
        [N, C, F*H] (tapped target states) at context_positions [N, C]; attention_mask [N, Q, C+Q] (True = may
        attend) or None, where every block row sees every context row and every block row.
        """
        c = self.hidden_norm(self.fc(context_features))
        x = block_embeds
        for layer in self.layers:
            x = layer(x, c, block_positions, context_positions, attention_mask)
        return self.norm(x)


def draft_logits(drafter: DFlashDraft, embed_tokens: torch.Tensor, lm_head: torch.Tensor,
                 context_features: torch.Tensor, root_id: int, context_positions: torch.Tensor | None = None):
    """One draft step (spec 1.3), for one stream: logits [B-1, V] of block rows 1..B-1 (row i: position P+i).

    embed_tokens and lm_head are the target's [V, H] matrices (the same tensor for a tied target);
    context_features [P, F*H] are the tapped states of committed rows, at positions 0..P-1 unless
    context_positions says otherwise; the root sits at the position after the last context row.
    """
    cfg = drafter.cfg
    if context_positions is None:
        context_positions = torch.arange(context_features.shape[0], device=context_features.device)
    root_position = int(context_positions[-1]) + 1
    block_ids = torch.full((cfg.block_size,), cfg.mask_token_id, device=embed_tokens.device)
    block_ids[0] = root_id
    block_positions = torch.arange(root_position, root_position + cfg.block_size, device=embed_tokens.device)
    hidden = drafter(embed_tokens[block_ids][None], block_positions[None], context_features[None],
                     context_positions[None])
    return hidden[0, 1:] @ lm_head.T


def anchored_block_logits(drafter: DFlashDraft, embed_tokens, lm_head, tokens, features, anchors):
    """Draft logits [S, A, B-1, V] for A anchors in each of S sequences, in one forward.

    tokens [S, L] and features [S, L, F*H] are whole sequences; the block of anchor P (in anchors [S, A]) is
    [tokens[P], mask, ...] at positions P..P+B-1 and sees the context rows 0..P-1 and its own block only:
    exactly `draft_logits` with context_features = features[:P], for every anchor at once.
    """
    cfg = drafter.cfg
    size = cfg.block_size
    seqs, count = anchors.shape
    length = tokens.shape[1]
    offsets = torch.arange(size, device=tokens.device)
    block_ids = torch.full((seqs, count, size), cfg.mask_token_id, device=tokens.device)
    block_ids[:, :, 0] = tokens.gather(1, anchors)
    block_positions = (anchors[:, :, None] + offsets).view(seqs, count * size)
    row_anchor = anchors.repeat_interleave(size, 1)
    sees_context = torch.arange(length, device=tokens.device)[None, None, :] < row_anchor[:, :, None]
    row_block = torch.arange(count * size, device=tokens.device) // size
    sees_block = (row_block[:, None] == row_block[None, :]).expand(seqs, -1, -1)
    mask = torch.cat([sees_context, sees_block], 2)
    context_positions = torch.arange(length, device=tokens.device).expand(seqs, -1)
    hidden = drafter(embed_tokens[block_ids.view(seqs, -1)], block_positions, features, context_positions, mask)
    return hidden.view(seqs, count, size, -1)[:, :, 1:] @ lm_head.T


# ---------------------------------------------------------------------------------------------------------------
# The target


def load_target(path: str | Path, device: torch.device):
    """The target as a frozen float32 transformers `Qwen3_5ForCausalLM` (tensorfold's weights, dequantized), and
    tensorfold's tokenizer."""
    from transformers import Qwen3_5ForCausalLM

    import tensorfold
    from tensorfold.model.writer import dense_tensors, write_checkpoint

    model = tensorfold.load(str(path), backend="numpy")
    with tempfile.TemporaryDirectory() as tmp:
        write_checkpoint(tmp, model.config, dense_tensors(model.net.weights), "hf-f32", tokenizer_from=model.path)
        target = Qwen3_5ForCausalLM.from_pretrained(tmp, dtype=torch.float32)
    return target.to(device).eval().requires_grad_(False), model.tokenizer


def target_head(target) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's input embedding and LM head, [V, H] each."""
    return target.get_input_embeddings().weight, target.get_output_embeddings().weight


@torch.no_grad()
def target_features(target, ids: torch.Tensor, layer_ids: list, batch: int,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Tapped states [N, L, F*H]: the output of decoder layer l (residual stream after its MLP add) for each l in
    layer_ids, in list order. Read by forward hooks, because transformers' `hidden_states[-1]` is the final-normed
    state, not the last layer's output."""
    captured = {}
    hooks = [target.model.layers[l].register_forward_hook(lambda module, args, out, l=l: captured.__setitem__(l, out))
             for l in layer_ids]
    features = torch.empty(*ids.shape, len(layer_ids) * target.config.hidden_size, dtype=dtype, device=ids.device)
    try:
        for start in range(0, ids.shape[0], batch):
            target.model(input_ids=ids[start:start + batch], use_cache=False)
            features[start:start + batch] = torch.cat([captured[l] for l in layer_ids], -1)
        return features
    finally:
        for hook in hooks:
            hook.remove()


def _cache_argument(out) -> dict:
    """The model output's cache as the keyword argument that passes it on: transformers 5.24 calls it `cache`,
    earlier 5.x releases `past_key_values` (both are in use on the machines this tool runs on)."""
    name = "cache" if hasattr(out, "cache") else "past_key_values"
    return {name: getattr(out, name)}


@torch.no_grad()
def generate(target, prompts: torch.Tensor, new_tokens: int, temperatures: torch.Tensor,
             generator: torch.Generator) -> torch.Tensor:
    """Continue every prompt [N, P0] by new_tokens: argmax where temperature is 0, else a sample (Gumbel-max) at
    that row's temperature. Returns [N, P0 + new_tokens]."""
    greedy = temperatures == 0
    scale = torch.where(greedy, 1.0, temperatures)[:, None]
    out = target(input_ids=prompts, use_cache=True, logits_to_keep=1)
    pieces = [prompts]
    for step in range(new_tokens):
        logits = out.logits[:, -1].float()
        uniform = torch.rand(logits.shape, device=logits.device, generator=generator).clamp_(1e-10, 1.0)
        sampled = (logits / scale - torch.log(-torch.log(uniform))).argmax(-1)
        next_ids = torch.where(greedy, logits.argmax(-1), sampled)
        pieces.append(next_ids[:, None])
        if step + 1 < new_tokens:
            out = target(input_ids=next_ids[:, None], use_cache=True, **_cache_argument(out))
    return torch.cat(pieces, 1)


# ---------------------------------------------------------------------------------------------------------------
# Distillation data


@dataclasses.dataclass
class DistillSet:
    """Sequences with their tapped target states, and per sequence the first anchor worth training on."""

    tokens: torch.Tensor  # [N, L] int64
    features: torch.Tensor  # [N, L, F*H]
    first_anchor: torch.Tensor  # [N]: the last prompt token for generated text, 1 for raw text
    kinds: list  # "greedy", "sampled" or "raw", per sequence

    def greedy_rows(self) -> torch.Tensor:
        return torch.tensor([i for i, kind in enumerate(self.kinds) if kind == "greedy"], dtype=torch.long)


SAMPLING_TEMPERATURES = (0.7, 1.0)


@dataclasses.dataclass
class SplitPlan:
    """What to build from one corpus split: prompts for the target to continue, and raw windows."""

    counts: dict  # sequences of each kind: greedy, sampled, raw
    prompts: np.ndarray  # [greedy + sampled, prompt_len], greedy ones first
    temperatures: np.ndarray  # per prompt; 0 = greedy
    windows: np.ndarray  # [raw, seq_len]


def plan_split(corpus: np.ndarray, total: int, args, rng, spread: bool) -> SplitPlan:
    """Prompts and windows at random offsets or, for validation, spread evenly over the corpus."""
    raw, sampled = round(total * args.raw_frac), round(total * args.sampled_frac)
    counts = {"greedy": total - raw - sampled, "sampled": sampled, "raw": raw}

    def cut(n, width):
        if spread:
            starts = np.linspace(0, corpus.size - width, n).astype(np.int64)
        else:
            starts = rng.integers(0, corpus.size - width + 1, size=n)
        return corpus[starts[:, None] + np.arange(width)]

    temperatures = np.concatenate([np.zeros(counts["greedy"]), rng.uniform(*SAMPLING_TEMPERATURES, sampled)])
    return SplitPlan(counts, cut(total - raw, args.prompt_len), temperatures, cut(raw, args.seq_len))


def build_sets(target, train: np.ndarray, val: np.ndarray, cfg: DraftConfig, args, device, rng, log) -> tuple:
    """Generate the target's continuations of the train and val prompts (in shared batches) and add raw windows;
    then capture the tapped states of every sequence."""
    t0 = time.time()
    plans = {"train": plan_split(train, args.sequences, args, rng, spread=False),
             "val": plan_split(val, args.val_sequences, args, rng, spread=True)}
    prompts = torch.from_numpy(np.concatenate([plan.prompts for plan in plans.values()])).to(device)
    temperatures = torch.from_numpy(np.concatenate([plan.temperatures for plan in plans.values()]).astype(np.float32))
    generator = torch.Generator(device=device).manual_seed(args.seed)
    new_tokens = args.seq_len - args.prompt_len
    batches = max(1, math.ceil(prompts.shape[0] / args.gen_batch))
    generated = torch.cat([
        generate(target, p, new_tokens, t, generator)
        for p, t in zip(prompts.tensor_split(batches), temperatures.to(device).tensor_split(batches))
    ])
    gen_seconds = time.time() - t0
    print(f"[data] generated {prompts.shape[0]} x {new_tokens} tokens in {batches} batch(es) in {gen_seconds:.1f}s",
          flush=True)

    t1 = time.time()
    # bf16 training states on a GPU: what the drafter's autocast reads anyway, at half the memory; float32 for
    # validation, so that tau is measured on the states the engine gives
    feature_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    sets, start = {}, 0
    for name, plan in plans.items():
        n_generated = len(plan.prompts)
        windows = torch.from_numpy(plan.windows).to(device)
        tokens = torch.cat([generated[start:start + n_generated], windows])
        start += n_generated
        first_anchor = torch.tensor([args.prompt_len - 1] * n_generated + [1] * len(windows), device=device)
        kinds = [kind for kind in ("greedy", "sampled", "raw") for _ in range(plan.counts[kind])]
        dtype = torch.float32 if name == "val" else feature_dtype
        features = target_features(target, tokens, cfg.target_layer_ids, args.feature_batch, dtype)
        sets[name] = DistillSet(tokens, features, first_anchor, kinds)
    feat_seconds = time.time() - t1
    print(f"[data] tapped states of {sum(s.tokens.shape[0] for s in sets.values())} x {args.seq_len} tokens "
          f"in {feat_seconds:.1f}s", flush=True)
    log["data"] = {
        "train": plans["train"].counts, "val": plans["val"].counts, "prompt_len": args.prompt_len,
        "seq_len": args.seq_len, "sampled_temperatures": list(SAMPLING_TEMPERATURES),
        "generate_seconds": round(gen_seconds, 1), "features_seconds": round(feat_seconds, 1),
    }
    return sets["train"], sets["val"]


# ---------------------------------------------------------------------------------------------------------------
# Training


def depth_weights(block_size: int, decay: float, device) -> torch.Tensor:
    """Loss weight of draft depth k = 1..B-1: exp(-(k-1)/decay), normalised to sum 1. A depth-k draft only counts
    when depths 1..k-1 were accepted too, so the early depths carry most of tau."""
    w = torch.exp(-torch.arange(block_size - 1, dtype=torch.float32, device=device) / decay)
    return w / w.sum()


def random_anchors(first_anchor: torch.Tensor, last_anchor: int, count: int, generator=None) -> torch.Tensor:
    """count anchors per sequence, uniform over first_anchor..last_anchor: [S, count]."""
    span = (last_anchor - first_anchor + 1).float()[:, None]
    u = torch.rand((first_anchor.shape[0], count), device=first_anchor.device, generator=generator)
    return first_anchor[:, None] + (u * span).long()


def block_loss(drafter, embed_tokens, lm_head, data: DistillSet, rows, anchors, weights):
    """(weighted cross-entropy, top-1 accuracy per depth [B-1]) of the blocks at anchors [S, A] in sequences rows."""
    size = drafter.cfg.block_size
    tokens = data.tokens[rows]
    logits = anchored_block_logits(drafter, embed_tokens, lm_head, tokens, data.features[rows], anchors)
    labels = tokens.gather(1, (anchors[:, :, None] + torch.arange(1, size, device=tokens.device)).flatten(1))
    labels = labels.view(anchors.shape[0], anchors.shape[1], size - 1)
    losses = F.cross_entropy(logits.float().flatten(0, 2), labels.flatten(), reduction="none").view_as(labels)
    accuracy = (logits.argmax(-1) == labels).float().mean((0, 1))
    return (losses * weights).sum(-1).mean(), accuracy


@torch.no_grad()
def validate(drafter, embed_tokens, lm_head, data: DistillSet, anchors, weights, batch: int, autocast):
    """Mean weighted loss and per-depth accuracy over fixed anchors [N, A] of the validation set."""
    drafter.eval()
    loss, accuracy, n = 0.0, 0.0, data.tokens.shape[0]
    for start in range(0, n, batch):
        rows = torch.arange(start, min(start + batch, n), device=anchors.device)
        with autocast():
            batch_loss, batch_accuracy = block_loss(drafter, embed_tokens, lm_head, data, rows, anchors[rows], weights)
        loss += float(batch_loss) * len(rows)
        accuracy = accuracy + batch_accuracy * len(rows)
    drafter.train()
    return loss / n, (accuracy / n).tolist()


def train_drafter(drafter, embed_tokens, lm_head, train: DistillSet, val: DistillSet, args, device, log):
    """AdamW with warmup and a cosine decay over the wall-clock budget; returns the state with the best
    validation loss."""
    use_cuda = device.type == "cuda"
    size = drafter.cfg.block_size
    last_anchor = args.seq_len - size
    weights = depth_weights(size, args.loss_decay, device)
    val_anchors = random_anchors(val.first_anchor, last_anchor, args.anchors,
                                 torch.Generator(device=device).manual_seed(args.seed + 1))

    def autocast():  # bf16 matmuls for the drafter on a GPU, over float32 master weights
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_cuda)

    decay = [p for p in drafter.parameters() if p.ndim >= 2]
    no_decay = [p for p in drafter.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=use_cuda)
    budget = args.minutes * 60.0

    def lr_at(step: int, elapsed: float) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        floor = args.lr * args.min_lr_frac
        return floor + 0.5 * (args.lr - floor) * (1.0 + math.cos(math.pi * min(elapsed / budget, 1.0)))

    history, best = [], {"val_loss": float("inf"), "step": 0, "state": None}
    train_loss = None

    def evaluate(step: int, elapsed: float):
        val_loss, val_accuracy = validate(drafter, embed_tokens, lm_head, val, val_anchors, weights,
                                          args.seqs_per_step, autocast)
        history.append({"step": step, "seconds": round(elapsed, 1), "train_loss": train_loss, "val_loss": val_loss,
                        "val_accuracy_by_depth": [round(a, 4) for a in val_accuracy]})
        mark = ""
        if val_loss < best["val_loss"]:
            state = {k: t.detach().to("cpu", copy=True) for k, t in drafter.state_dict().items()}
            best.update(val_loss=val_loss, step=step, seconds=round(elapsed, 1), state=state)
            mark = " *"
        print(f"[eval] step {step} t {elapsed:.0f}s val_loss {val_loss:.4f} acc d1 {val_accuracy[0]:.3f} "
              f"d2 {val_accuracy[1]:.3f} d4 {val_accuracy[3]:.3f} d8 {val_accuracy[7]:.3f}{mark}", flush=True)

    drafter.train()
    n_train = train.tokens.shape[0]
    step, running, running_n = 0, 0.0, 0
    t0 = last_eval = last_log = time.time()
    while time.time() - t0 < budget:
        lr = lr_at(step, time.time() - t0)
        for group in opt.param_groups:
            group["lr"] = lr
        rows = torch.randint(0, n_train, (args.seqs_per_step,), device=device)
        anchors = random_anchors(train.first_anchor[rows], last_anchor, args.anchors)
        with autocast():
            loss, _ = block_loss(drafter, embed_tokens, lm_head, train, rows, anchors, weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        step += 1
        running, running_n = running + loss.detach(), running_n + 1
        if step % args.log_steps == 0 or step <= 3:
            now = time.time()
            train_loss = float(running) / running_n
            blocks = running_n * args.seqs_per_step * args.anchors
            print(f"step {step:6d} t {now - t0:6.1f}s lr {lr:.2e} loss {train_loss:.4f} "
                  f"blocks/s {blocks / max(now - last_log, 1e-9):,.0f}", flush=True)
            running, running_n, last_log = 0.0, 0, now
        if time.time() - last_eval >= args.eval_seconds:
            evaluate(step, time.time() - t0)
            last_eval = time.time()
    train_seconds = time.time() - t0
    evaluate(step, train_seconds)
    log["training"] = {
        "steps": step, "blocks_seen": step * args.seqs_per_step * args.anchors, "seconds": round(train_seconds, 1),
        "best_val_loss": best["val_loss"], "best_step": best["step"], "best_seconds": best["seconds"],
        "last_val_loss": history[-1]["val_loss"], "loss_weights": [round(float(w), 5) for w in weights],
        "history": history,
    }
    return best["state"]


# ---------------------------------------------------------------------------------------------------------------
# Acceptance length


def best_first_tree(top_logprobs: np.ndarray, top_tokens: np.ndarray, budget: int) -> tuple[list, list, list]:
    """DDTree (spec 3): the `budget` most likely paths under the product of per-depth marginals.

    top_logprobs and top_tokens [D, k] are each depth's candidates, best first. Returns (tokens, parents,
    depths) of the nodes in creation order; node i is row i+1 of the tree and parent 0 is the root.
    """
    depth_count, rank_count = top_logprobs.shape
    tokens, parents, depths = [], [], []
    heap = [(-top_logprobs[0, 0], 1, 0, 0)]  # (-score, depth, rank, parent row)
    while heap and len(tokens) < budget:
        neg_score, depth, rank, parent = heapq.heappop(heap)
        tokens.append(int(top_tokens[depth - 1, rank]))
        parents.append(parent)
        depths.append(depth)
        row = len(tokens)
        score = -neg_score
        if rank + 1 < rank_count:  # the next sibling
            heapq.heappush(heap, (-(score - top_logprobs[depth - 1, rank] + top_logprobs[depth - 1, rank + 1]),
                                  depth, rank + 1, parent))
        if depth < depth_count:  # the first child
            heapq.heappush(heap, (-(score + top_logprobs[depth, 0]), depth + 1, 0, row))
    return tokens, parents, depths


def accepted_in_tree(tokens: list, parents: list, truth: np.ndarray) -> int:
    """Walk from the root while some child holds the target's token at that depth; the count of accepted nodes."""
    children = {(parent, token): row for row, (parent, token) in enumerate(zip(parents, tokens), start=1)}
    current, accepted = 0, 0
    while accepted < len(truth) and (current, int(truth[accepted])) in children:
        current = children[(current, int(truth[accepted]))]
        accepted += 1
    return accepted


@torch.no_grad()
def acceptance_length(drafter, embed_tokens, lm_head, data: DistillSet, rows: torch.Tensor, prompt_len: int,
                      tree_budget: int | None):
    """Mean tau (tokens committed per round, bonus included) of drafted greedy decoding over the greedy sequences
    rows: the first round's root is the token the prompt's prefill produced, at position prompt_len; each round
    drafts at the committed length P from the states of rows 0..P-1 and accepts the drafts that match the
    target's own greedy text, which is what a verify pass produces. Chain drafting when tree_budget is None, else
    a best-first tree of that many nodes."""
    drafter.eval()
    size = drafter.cfg.block_size
    tokens, features = data.tokens[rows], data.features[rows]
    truth_all = tokens.cpu().numpy()
    length = tokens.shape[1]
    position = torch.full((len(rows),), prompt_len, device=tokens.device)
    committed, rounds = 0, 0
    while True:
        active = (position <= length - size).nonzero().flatten()
        if active.numel() == 0:
            break
        anchors = position[active][:, None]
        logits = anchored_block_logits(drafter, embed_tokens, lm_head, tokens[active], features[active], anchors)
        logits = logits[:, 0].float()
        if tree_budget is None:
            drafts = logits.argmax(-1).cpu().numpy()
        else:
            top = torch.log_softmax(logits, -1).topk(min(tree_budget, logits.shape[-1]), -1)
            top_logprobs, top_tokens = top.values.cpu().numpy(), top.indices.cpu().numpy()
        for i, seq in enumerate(active.tolist()):
            p = int(position[seq])
            truth = truth_all[seq, p + 1:p + size]
            if tree_budget is None:
                accepted = int(np.cumprod(drafts[i] == truth).sum())
            else:
                accepted = accepted_in_tree(*best_first_tree(top_logprobs[i], top_tokens[i], tree_budget)[:2], truth)
            position[seq] += accepted + 1
            committed += accepted + 1
            rounds += 1
    drafter.train()
    return committed / max(rounds, 1)


# ---------------------------------------------------------------------------------------------------------------
# Export


def export(folder: Path, drafter: DFlashDraft) -> dict:
    """config.json and model.safetensors (bf16, PyTorch [out, in]); returns the tensors written."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to("cpu", torch.bfloat16).contiguous() for name, t in drafter.state_dict().items()}
    assert len(tensors) == 3 + 11 * drafter.cfg.num_hidden_layers, sorted(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(drafter.cfg.to_json(), indent=2) + "\n")
    return tensors


def load_drafter(folder: str | Path, device: str | torch.device = "cpu") -> DFlashDraft:
    """An exported drafter, in float32."""
    from safetensors.torch import load_file

    folder = Path(folder)
    drafter = DFlashDraft(DraftConfig.from_json(json.loads((folder / "config.json").read_text())))
    drafter.load_state_dict({k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()})
    return drafter.to(device).eval()


CARD = """# DFlash block drafter for {target_name}

A DFlash-style block drafter for the {target_layers}-layer target `{target_name}`: in one forward it drafts the next
{drafts} tokens in parallel from the target's hidden states, for the engine to verify in one target pass. z-lab
DFlash checkpoint format (`DFlashDraftModel`): no embedding and no LM head of its own (it uses the target's), bf16.

| | |
|---|---|
| architecture | {layers} Qwen3-style layer(s), every one `full_attention` (non-causal in the block); hidden {hidden}, MLP {intermediate}, attention {heads} query / {kv_heads} KV heads of {head_dim}, RoPE theta {rope_theta:g} over the whole head |
| target features | outputs of target layers {layer_ids} (0-based), concatenated: `fc` {fc_in} -> {hidden}, then `hidden_norm` |
| block | size {block_size}: [root, mask x {drafts}], mask token id {mask_id} (`{mask_token}`, never in the corpus) |
| parameters | {parameters:,} |
| acceptance (tau) | **{tau_chain:.2f}** tokens per round with greedy chain drafts, **{tau_tree:.2f}** with a best-first tree of {tree_budget} nodes, against the target's greedy text ({tau_sequences} held-out prompts of {prompt_len} tokens from *{val_play}*, {tau_tokens} tokens each) |
| validation loss | {val_loss:.4f} (weighted cross-entropy over depths 1..{drafts}) |

## Training

Self-distillation: {n_greedy} greedy and {n_sampled} sampled (temperature {t_low} to {t_high}) continuations by the
target of {prompt_len}-token prompts cut from the training split, plus {n_raw} raw windows of it, each {seq_len}
tokens, with the target's hidden states from one forward each. Every step draws {anchors} random anchors in each of
{seqs_per_step} sequences; the block of anchor P sees the states of rows 0..P-1 and predicts x(P+1..P+{drafts}),
with a cross-entropy weighted exp(-(k-1)/{loss_decay:g}) at depth k. AdamW lr {lr}, weight decay {weight_decay},
cosine over {minutes:g} minutes: {steps:,} steps; kept the checkpoint with the best validation loss (step
{best_step}). {device_name}, torch {torch}, transformers {transformers}.

## Reproduce

```bash
{command}
```
"""


def model_card(log: dict) -> str:
    cfg, args = log["config"], log["args"]
    dflash = cfg["dflash_config"]
    return CARD.format(
        target_name=Path(args["target"]).name, target_layers=cfg["num_target_layers"], drafts=cfg["block_size"] - 1,
        layers=cfg["num_hidden_layers"], hidden=cfg["hidden_size"], intermediate=cfg["intermediate_size"],
        heads=cfg["num_attention_heads"], kv_heads=cfg["num_key_value_heads"], head_dim=cfg["head_dim"],
        rope_theta=cfg["rope_theta"], layer_ids=", ".join(map(str, dflash["target_layer_ids"])),
        fc_in=len(dflash["target_layer_ids"]) * cfg["hidden_size"], block_size=cfg["block_size"],
        mask_id=dflash["mask_token_id"], mask_token=log["mask_token"], parameters=log["parameters"],
        tau_chain=log["tau"]["chain"], tau_tree=log["tau"]["tree"], tree_budget=log["tau"]["tree_budget"],
        tau_sequences=log["tau"]["sequences"], tau_tokens=args["seq_len"] - args["prompt_len"],
        prompt_len=args["prompt_len"], val_play=log["val_play"] or "the validation split",
        val_loss=log["training"]["best_val_loss"], t_low=SAMPLING_TEMPERATURES[0], t_high=SAMPLING_TEMPERATURES[1],
        n_greedy=log["data"]["train"]["greedy"], n_sampled=log["data"]["train"]["sampled"],
        n_raw=log["data"]["train"]["raw"], seq_len=args["seq_len"], anchors=args["anchors"],
        seqs_per_step=args["seqs_per_step"], loss_decay=args["loss_decay"], lr=args["lr"],
        weight_decay=args["weight_decay"], minutes=args["minutes"], steps=log["training"]["steps"],
        best_step=log["training"]["best_step"], device_name=log["device_name"], torch=log["torch"],
        transformers=log["transformers"], command=log["command"],
    )


# ---------------------------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    from tensorfold.models import DEFAULT_MODEL

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=DEFAULT_MODEL, help="target checkpoint (any that tensorfold loads)")
    ap.add_argument("--data", type=Path, required=True, help="folder with train.npy and val.npy (uint16 ids)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--minutes", type=float, required=True, help="wall-clock training budget")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--layers", type=int, default=2, help="drafter layers")
    ap.add_argument("--target-layers", default="1,3,5,7", help="tapped target layers, 0-based")
    ap.add_argument("--mask-token-id", type=int, default=4094, help="a token the corpus never contains")
    ap.add_argument("--sequences", type=int, default=12288, help="training sequences")
    ap.add_argument("--val-sequences", type=int, default=96)
    ap.add_argument("--sampled-frac", type=float, default=0.3, help="share of sampled continuations")
    ap.add_argument("--raw-frac", type=float, default=0.2, help="share of raw corpus windows; the rest is greedy")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=512, help="tokens per sequence, prompt included")
    ap.add_argument("--gen-batch", type=int, default=16384, help="prompts continued at once")
    ap.add_argument("--feature-batch", type=int, default=512, help="sequences per target forward for the states")
    ap.add_argument("--seqs-per-step", type=int, default=128)
    ap.add_argument("--anchors", type=int, default=32, help="anchors (blocks) per sequence per step")
    ap.add_argument("--loss-decay", type=float, default=7.0, help="depth k weighs exp(-(k-1)/this)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1, help="cosine floor, as a fraction of --lr")
    ap.add_argument("--warmup", type=int, default=50, help="linear warmup steps")
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--eval-seconds", type=float, default=20.0, help="validate every this many seconds")
    ap.add_argument("--log-steps", type=int, default=50)
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    import transformers

    args = parse_args(argv)
    started = time.time()
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    device = torch.device(args.device)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False  # the target runs in true float32, like the engine
    torch.backends.cudnn.allow_tf32 = False
    print(f"python {platform.python_version()} torch {torch.__version__} transformers {transformers.__version__} "
          f"device {device} {device_name}", flush=True)

    train = np.load(args.data / "train.npy").astype(np.int64)
    val = np.load(args.data / "val.npy").astype(np.int64)
    if (train == args.mask_token_id).any() or (val == args.mask_token_id).any():
        raise SystemExit(f"mask token id {args.mask_token_id} occurs in the corpus: choose another")
    meta_path = args.data / "meta.json"
    val_play = json.loads(meta_path.read_text()).get("val_play") if meta_path.exists() else None

    target, tokenizer = load_target(args.target, device)
    target_cfg = target.config
    load_seconds = time.time() - started
    print(f"[time] target loaded in {load_seconds:.1f}s", flush=True)
    cfg = DraftConfig(
        hidden_size=target_cfg.hidden_size, vocab_size=target_cfg.vocab_size,
        num_target_layers=target_cfg.num_hidden_layers,
        target_layer_ids=[int(x) for x in args.target_layers.split(",")], mask_token_id=args.mask_token_id,
        num_hidden_layers=args.layers, max_position_embeddings=target_cfg.max_position_embeddings,
    )
    assert cfg.target_layer_ids == sorted(cfg.target_layer_ids) and cfg.target_layer_ids[-1] < cfg.num_target_layers
    assert args.seq_len >= args.prompt_len + cfg.block_size

    log = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
           "command": "python tools/train_drafter.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "val_play": val_play, "mask_token": tokenizer.decode([cfg.mask_token_id]),
           "torch": torch.__version__, "transformers": transformers.__version__,
           "python": platform.python_version(), "device": str(device), "device_name": device_name}
    train_set, val_set = build_sets(target, train, val, cfg, args, device, rng, log)

    drafter = DFlashDraft(cfg).to(device)
    log["parameters"] = sum(p.numel() for p in drafter.parameters())
    print(f"[drafter] {cfg.num_hidden_layers} layers, {log['parameters']:,} parameters, target layers "
          f"{cfg.target_layer_ids}, mask {cfg.mask_token_id}", flush=True)
    embed_tokens, lm_head = target_head(target)
    best_state = train_drafter(drafter, embed_tokens, lm_head, train_set, val_set, args, device, log)

    t_eval = time.time()
    drafter.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in best_state.items()})  # as exported
    greedy_rows = val_set.greedy_rows().to(device)
    tree_budget = cfg.block_size - 1
    log["tau"] = {
        "chain": acceptance_length(drafter, embed_tokens, lm_head, val_set, greedy_rows, args.prompt_len, None),
        "tree": acceptance_length(drafter, embed_tokens, lm_head, val_set, greedy_rows, args.prompt_len, tree_budget),
        "tree_budget": tree_budget, "sequences": len(greedy_rows), "weights": "bf16 (as exported), run in float32",
        "seconds": round(time.time() - t_eval, 1),
    }
    print(f"[tau] chain {log['tau']['chain']:.3f}  tree({tree_budget}) {log['tau']['tree']:.3f}  on "
          f"{len(greedy_rows)} greedy val sequences in {log['tau']['seconds']:.1f}s", flush=True)

    log["config"] = cfg.to_json()
    export(args.out, drafter)
    log["wall_seconds"] = {"load": round(load_seconds, 1), "total": round(time.time() - started, 1)}
    (args.out / "train_log.json").write_text(json.dumps(log, indent=2) + "\n")
    (args.out / "README.md").write_text(model_card(log))
    print(f"[time] load {load_seconds:.0f}s, generate {log['data']['generate_seconds']:.0f}s, states "
          f"{log['data']['features_seconds']:.0f}s, train {log['training']['seconds']:.0f}s, tau "
          f"{log['tau']['seconds']:.0f}s", flush=True)
    print(f"done in {time.time() - started:.0f}s: best val_loss {log['training']['best_val_loss']:.4f}, tau chain "
          f"{log['tau']['chain']:.2f} tree {log['tau']['tree']:.2f}; saved {args.out}", flush=True)
    return log


if __name__ == "__main__":
    main()
