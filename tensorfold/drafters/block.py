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
(best-first over each row's top k). Its checkpoint (config and tensors) is read and checked by dflash_checkpoint.py.
"""
import dataclasses
import math
import os

import numpy as np

from tensorfold.cuda.topk import MAX_K
from tensorfold.drafters.base import Drafter
from tensorfold.drafters.dflash_checkpoint import DFlashConfig, load_dflash_weights
from tensorfold.drafters.replay import DraftGraphs, block_table, extend_table
from tensorfold.drafters.trees import best_first_tree
from tensorfold.errors import TensorfoldError
from tensorfold.model.checkpoint import Linear, resolve
from tensorfold.model.config import _is_int
from tensorfold.model.replay import replays_decode_rounds

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

    def extend(self, context: DraftContext, features: list, position: int, kept: list | None = None) -> None:
        """Commit rows of `features` (the F tapped target layer outputs [n, H], in target_layer_ids order) to the
        context at positions position, position + 1, ...: the rows `kept`, in that order, all n by default."""
        rows = features[0].shape[0]
        kept = range(rows) if kept is None else kept
        assert len(features) == self.config.num_taps, f"{len(features)} feature arrays for {self.config.num_taps} taps"
        assert position >= context.next_position, f"rows at {position} would go before the context's end"
        self.reserve(context, rows)
        self.write_context(context, features, self.ops.upload(extend_table(context.length, position, kept, rows)))
        context.commit(position, len(kept))

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
        self.contexts = 0  # contexts made (an engine makes one a lane, then resets it in place)

    @property
    def recordings(self) -> int:
        return self.graphs.recorded if self.graphs is not None else 0

    @property
    def window_rows(self) -> int:
        """The block's height: its root and up to rows - 1 guesses."""
        return self.rows

    def new_stream(self) -> DraftContext:
        self.contexts += 1
        if self.graphs is not None:  # room for every context's recordings (drafters/replay.py)
            self.graphs.fit(self.contexts)
        return self.model.new_context()

    def reset(self, state: DraftContext) -> DraftContext:
        """The context emptied in its own buffers (no row is read past its length), whose recordings then replay."""
        state.positions = np.zeros(0, np.int64)
        return state

    def observe(self, state: DraftContext, features: list, position: int, kept: list | None = None) -> None:
        """Committed rows at positions position, position + 1, ..., with their tapped features [n, H] each: the rows
        `kept` of the n, in that order (all by default)."""
        kept = range(features[0].shape[0]) if kept is None else kept
        if self.graphs is not None and self.graphs.fits(features):
            self.graphs.extend(state, features, position, kept)
        else:
            self.model.extend(state, features, position, kept)

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
