"""The DFlash block drafter: config and checkpoint checks (each by its message), a random checkpoint for the tiny
target, the block forward against a float64 re-computation of the spec's formulas (with planted controls that must
break the match), the numpy and simulated cuda backends byte for byte, the top-k twin and the best-first tree."""
import dataclasses
import itertools
import json
import os
import re

import numpy as np
import pytest
from safetensors.numpy import save_file

import tensorfold
from tensorfold.api import Model
from tensorfold.backends import make_backend
from tensorfold.cuda import gemv, rmsnorm, topk
from tensorfold.drafters.block import BlockDrafter, load_dflash, load_drafter
from tensorfold.drafters.dflash_checkpoint import (
    DFlashConfig,
    default_target_layer_ids,
    expected_shapes,
    load_dflash_weights,
)
from tensorfold.drafters.trees import best_first_tree
from tensorfold.errors import CheckpointError, ConfigError, TensorfoldError
from tensorfold.model.checkpoint import load_weights
from tensorfold.model.safetensors_io import write_file
from tensorfold.model.tiny import TINY_CONFIG, random_tensors
from tensorfold.model.writer import write_checkpoint
from tensorfold.numerics.formats import f32_to_bf16

# A drafter for the tiny target (H 64, vocab 512, 4 layers): 2 layers, 4/2 heads of 16, taps at target layers 0, 2.
DRAFT = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96, "vocab_size": 512,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000, "num_target_layers": 4, "block_size": 8,
    "layer_types": ["full_attention", "full_attention"], "hidden_act": "silu", "attention_bias": False,
    "dflash_config": {"target_layer_ids": [0, 2], "mask_token_id": 500},
}


def draft_config(changes: dict | None = None, **draft_changes) -> dict:
    d = json.loads(json.dumps(DRAFT))
    d.update(changes or {})
    d["dflash_config"].update(draft_changes)
    return d


def random_drafter_tensors(config: DFlashConfig, seed: int = 0) -> dict:
    """float32 tensors for every name the config implies; norm weights near 1 (plain norms multiply by them)."""
    rng = np.random.default_rng(seed)
    return {name: (1.0 + rng.normal(0, 0.3, shape) if len(shape) == 1 else
                   rng.normal(0, 1 / np.sqrt(shape[1]), shape)).astype(np.float32)
            for name, shape in expected_shapes(config).items()}


def write_drafter(folder, config_dict: dict, tensors: dict) -> str:
    """A bf16 drafter checkpoint in the z-lab layout (config.json and model.safetensors)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config_dict, f)
    write_file(os.path.join(folder, "model.safetensors"), {n: ("BF16", f32_to_bf16(a)) for n, a in tensors.items()})
    return str(folder)


@pytest.fixture(scope="module")
def target(tiny_hf):
    return tensorfold.load(tiny_hf, backend="numpy")


@pytest.fixture(scope="module")
def drafter_folder(tmp_path_factory):
    config = DFlashConfig.from_dict(DRAFT)
    return write_drafter(tmp_path_factory.mktemp("dflash"), DRAFT, random_drafter_tensors(config))


@pytest.fixture(scope="module")
def model(drafter_folder, target):
    return load_dflash(drafter_folder, target)


def features(rng, rows, taps=2, hidden=64):
    return [rng.normal(size=(rows, hidden)).astype(np.float32) for _ in range(taps)]


# --- config -----------------------------------------------------------------------------------------------------------

def test_config_reads_both_layouts_and_the_defaults():
    def read(config):
        c = DFlashConfig.from_dict(config)
        return c.target_layer_ids, c.mask_token_id, c.block_size, c.rope_theta

    assert read(DRAFT) == ((0, 2), 500, 8, 1e6)
    top_level = draft_config({"target_layer_ids": [1, 3], "mask_token_id": 7, "rope_parameters": {"rope_theta": 5e5}})
    del top_level["dflash_config"], top_level["block_size"], top_level["rope_theta"]
    assert read(top_level) == ((1, 3), 7, 16, 5e5)  # ids and mask at the top, block_size 16 by default
    assert DFlashConfig.from_dict(draft_config(block_size=4)).block_size == 4  # dflash_config wins
    no_ids = draft_config({"num_target_layers": 36, "num_hidden_layers": 5, "layer_types": ["full_attention"] * 5})
    del no_ids["dflash_config"]["target_layer_ids"]
    assert DFlashConfig.from_dict(no_ids).target_layer_ids == (1, 9, 17, 25, 33)


def test_default_target_layer_ids_follow_the_reference_formula():
    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)  # Qwen3-8B-DFlash-b16
    assert default_target_layer_ids(64, 5) == (1, 16, 31, 46, 61)  # Qwen3.5-27B
    assert default_target_layer_ids(32, 8) == (1, 5, 9, 13, 17, 21, 25, 29)  # Qwen3.5-4B's 8 taps
    assert default_target_layer_ids(32, 1) == (16,)


@pytest.mark.parametrize("config, message", [
    (draft_config({"num_key_value_heads": 0}), "num_key_value_heads must be a positive integer, got 0"),
    (draft_config({"num_attention_heads": 3}), r"num_attention_heads \(3\) must be a multiple of num_key_value_heads"),
    (draft_config(target_layer_ids=[0, 4]), r"target_layer_ids\[1\] is 4, outside the target's layers 0 .. 3"),
    (draft_config(target_layer_ids=[2, 0]), r"target_layer_ids must be sorted and unique, got \[2, 0\]"),
    (draft_config(target_layer_ids=[1, 1]), r"target_layer_ids must be sorted and unique, got \[1, 1\]"),
    (draft_config(mask_token_id=512), r"mask_token_id must be a token id below vocab_size \(512\), got 512"),
    (draft_config(mask_token_id=None), "missing required field mask_token_id"),
    (draft_config({"block_size": 1}, block_size=None), "block_size must be an integer of at least 2"),
    (draft_config({"head_dim": 15}), "head_dim must be even"),
    (draft_config({"architectures": ["DFlash2DraftModel"]}), "DFlash2 drafter .* a different model"),
    (draft_config(output_multiplier=0.2), "DFlash2 drafter .* a different model"),
    (draft_config({"architectures": ["Qwen3ForCausalLM"]}), "not a DFlash drafter"),
    (draft_config({"layer_types": ["sliding_attention", "full_attention"]}),
     r"layer_types\[0\] is 'sliding_attention': only full_attention drafter layers are supported"),
    (draft_config(causal=True), "causal drafter .* is not supported"),
    (draft_config(use_swa=True), "sliding-window drafter .* is not supported"),
    (draft_config({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}), "rope_scaling type 'yarn' is not supported"),
    (draft_config({"hidden_act": "gelu"}), "hidden_act 'gelu' is not supported"),
])
def test_bad_configs_are_refused_by_name(config, message):
    with pytest.raises(ConfigError, match=message):
        DFlashConfig.from_dict(config)


def test_a_bad_config_file_is_refused_naming_the_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(draft_config({"head_dim": 15})))
    with pytest.raises(ConfigError, match=f"^{re.escape(str(tmp_path / 'config.json'))}: head_dim must be even"):
        DFlashConfig.from_file(tmp_path)


@pytest.mark.parametrize("changes, message", [
    ({"hidden_size": 32}, "hidden_size is 32, but the target's is 64"),
    ({"vocab_size": 1024}, "vocab_size is 1024, but the target's is 512"),
    ({"num_target_layers": 36}, "num_target_layers is 36, but the target has 4 layers"),
])
def test_a_drafter_for_another_target_is_refused(changes, message):
    with pytest.raises(ConfigError, match=message):
        DFlashConfig.from_dict(draft_config(changes)).check_target(TINY_CONFIG)


# --- the checkpoint ---------------------------------------------------------------------------------------------------

def test_a_random_checkpoint_loads(drafter_folder, target, tmp_path):
    config = DFlashConfig.from_dict(DRAFT)
    weights = load_dflash_weights(drafter_folder, config)
    assert len(weights) == 3 + 11 * config.num_hidden_layers
    assert weights["fc.weight"].kind == "bf16" and weights["norm.weight"].dtype == np.float32
    tensors = random_drafter_tensors(config, seed=3)  # the same layout in float32, written by the safetensors package
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(DRAFT))
    drafter = load_drafter(str(tmp_path), target)
    assert drafter.taps == (0, 2) and drafter.name == "dflash" and drafter.rows == 8
    assert drafter.model.weights["layers.1.mlp.down_proj.weight"].dense().tobytes() == \
        tensors["layers.1.mlp.down_proj.weight"].tobytes()


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.pop("layers.1.mlp.up_proj.weight"), r"missing tensor layers.1.mlp.up_proj.weight \(expected shape"),
    (lambda t: t.update({"layers.0.self_attn.k_norm.weight": np.ones(8, np.float32)}),
     r"tensor layers.0.self_attn.k_norm.weight: shape \[8\], expected \[16\]"),
    (lambda t: t.update({"fc.weight": np.zeros((64, 192), np.float32)}),
     r"tensor fc.weight: shape \[64, 192\], expected \[64, 128\] \(2 target layers x hidden size 64\)"),
    (lambda t: t.update({"candidate_selector.predecessor_codebook": np.zeros((512, 8), np.float32)}),
     "candidate_selector.predecessor_codebook belongs to a DFlash2 drafter .* a different model"),
    (lambda t: t.update({"layers.0.attention_conv.base_kernel": np.zeros((2, 2, 64), np.float32)}),
     "belongs to a DFlash2 drafter"),
    (lambda t: t.update({"lm_head.weight": np.zeros((512, 64), np.float32)}), "unexpected tensor lm_head.weight"),
])
def test_bad_checkpoints_are_refused_by_tensor(edit, message, tmp_path, target):
    tensors = random_drafter_tensors(DFlashConfig.from_dict(DRAFT))
    edit(tensors)
    with pytest.raises(CheckpointError, match=message):
        load_dflash(write_drafter(tmp_path, DRAFT, tensors), target)


def test_the_target_is_checked_before_the_tensors(tmp_path, target):
    config = draft_config({"hidden_size": 32})
    tensors = random_drafter_tensors(DFlashConfig.from_dict(config))
    with pytest.raises(ConfigError, match="hidden_size is 32, but the target's is 64"):
        load_dflash(write_drafter(tmp_path, config, tensors), target)


# --- the block forward against the spec's formulas in float64 ---------------------------------------------------------

def rms64(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope64(x, positions, theta):
    """Rotate-half over the whole head: pair (j, j + D/2) turns by position * theta^(-2j / D)."""
    half = x.shape[-1] // 2
    angle = np.asarray(positions, np.float64)[:, None] * theta ** (-np.arange(half) * 2.0 / x.shape[-1])
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    first, second = x[..., :half], x[..., half:]
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def reference_block_logits(model, weights, context_features, context_positions, root, rows, start, causal=False,
                           key_shift=0):
    """block_logits written out from the spec in float64. Controls: `causal` masks later block rows, `key_shift`
    ropes the context keys at shifted positions."""
    c = model.config
    w = {name: (v.dense() if hasattr(v, "dense") else v).astype(np.float64) for name, v in weights.items()}
    eps, theta, hq, hkv, dh = c.rms_norm_eps, c.rope_theta, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    context = rms64(np.concatenate(context_features, axis=1) @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
    h = model.embedding.dense().astype(np.float64)[[root] + [c.mask_token_id] * (rows - 1)]
    positions, n = start + np.arange(rows), len(context)
    for i in range(c.num_hidden_layers):
        p = f"layers.{i}."

        def keys_values(x, at):
            k = rms64((x @ w[p + "self_attn.k_proj.weight"].T).reshape(len(x), hkv, dh),
                      w[p + "self_attn.k_norm.weight"], eps)
            return rope64(k, at, theta), (x @ w[p + "self_attn.v_proj.weight"].T).reshape(len(x), hkv, dh)

        x = rms64(h, w[p + "input_layernorm.weight"], eps)
        q = rms64((x @ w[p + "self_attn.q_proj.weight"].T).reshape(rows, hq, dh), w[p + "self_attn.q_norm.weight"], eps)
        q = rope64(q, positions, theta)
        context_keys, context_values = keys_values(context, np.asarray(context_positions) + key_shift)
        block_keys, block_values = keys_values(x, positions)
        keys = np.repeat(np.concatenate([context_keys, block_keys]), hq // hkv, axis=1)  # query head h: KV h // group
        values = np.repeat(np.concatenate([context_values, block_values]), hq // hkv, axis=1)
        scores = np.einsum("rhd,nhd->rhn", q, keys) / np.sqrt(dh)
        if causal:
            later = np.arange(rows)[None, :] > np.arange(rows)[:, None]
            scores[:, :, n:] = np.where(later[:, None, :], -np.inf, scores[:, :, n:])
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        out = np.einsum("rhn,nhd->rhd", probs, values).reshape(rows, hq * dh)
        h = h + out @ w[p + "self_attn.o_proj.weight"].T
        x = rms64(h, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        h = h + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    return rms64(h[1:], w["norm.weight"], eps) @ model.lm_head.dense().astype(np.float64).T


def test_block_logits_follow_the_spec(model, drafter_folder):
    weights = load_dflash_weights(drafter_folder, model.config)
    rng = np.random.default_rng(1)
    first, second = features(rng, 5), features(rng, 3)
    context = model.new_context()
    model.extend(context, first, position=37)  # a context that starts mid-stream, as after a prompt-cache resume
    model.extend(context, second, position=42)
    assert list(context.positions) == list(range(37, 45))
    got = model.block_logits(context, 11, 6)
    assert got.shape == (5, 512)
    everything = [np.concatenate(pair) for pair in zip(first, second)]
    args = (model, weights, everything, np.arange(37, 45), 11, 6, 45)
    expected = reference_block_logits(*args)
    tolerance = 1e-4 * np.abs(expected).max()
    assert np.abs(got - expected).max() < tolerance
    for control in ({"causal": True}, {"key_shift": 1}):  # planted: each must break the match by far
        assert np.abs(got - reference_block_logits(*args, **control)).max() > 100 * tolerance, control


def test_context_rows_are_independent_of_how_they_arrive(model):
    rng = np.random.default_rng(2)
    rows = features(rng, 6)
    at_once, in_pieces = model.new_context(), model.new_context()
    model.extend(at_once, rows, position=0)
    model.extend(in_pieces, [f[:2] for f in rows], position=0)
    before = model.block_logits(in_pieces, 3, 8)  # writes a block past the context, to be overwritten
    assert before.tobytes() == model.block_logits(in_pieces, 3, 8).tobytes()
    model.extend(in_pieces, [f[2:] for f in rows], position=2)
    assert model.block_logits(at_once, 3, 5).tobytes() == model.block_logits(in_pieces, 3, 5).tobytes()
    for i in range(model.config.num_hidden_layers):
        assert at_once.keys[i][:6].tobytes() == in_pieces.keys[i][:6].tobytes()


def test_drafter_chain_and_tree(model):
    rng = np.random.default_rng(4)
    drafter, chain_drafter = BlockDrafter(model, shape="tree"), BlockDrafter(model, shape="chain", rows=5)
    state = drafter.new_stream()
    tokens = [5, 9, 13, 200]  # the root 200 sits at position 3, after the three observed rows
    drafter.observe(state, features(rng, 3), position=0)
    logits = model.block_logits(state, 200, 8)
    chain = drafter.propose(tokens, 15, state)
    assert chain == list(np.argmax(logits, axis=1))  # rows - 1 = 7 guesses
    assert drafter.propose(tokens, 3, state) == chain[:3]  # fewer guesses: the full block's first rows
    short_chain = list(np.argmax(model.block_logits(state, 200, 5), axis=1))
    assert chain_drafter.propose_tree(tokens, 15, state) == (short_chain, [-1, 0, 1, 2])
    ids, parents = drafter.propose_tree(tokens, 15, state)
    assert len(ids) == len(parents) == 7 and ids[0] == chain[0] and parents[0] == -1
    assert all(-1 <= parent < node for node, parent in enumerate(parents))
    assert drafter.propose(tokens, 0, state) == [] and drafter.propose_tree(tokens, 0, state) == ([], [])
    assert len(drafter.propose([7], 4, drafter.new_stream())) == 4  # an empty context drafts from the root alone
    with pytest.raises(TensorfoldError, match="drafter rows must be between 2 and the block size 8"):
        BlockDrafter(model, rows=16)


# --- the cuda backend in the simulator --------------------------------------------------------------------------------

L, F = "linear_attention", "full_attention"
MICRO = dataclasses.replace(
    TINY_CONFIG, vocab_size=48, hidden_size=16, intermediate_size=16, num_hidden_layers=2, layer_types=(L, F),
    num_attention_heads=2, num_key_value_heads=1, head_dim=8, linear_num_key_heads=1, linear_num_value_heads=2,
    linear_key_head_dim=4, linear_value_head_dim=4, tie_word_embeddings=True, eos_token_ids=(0,))
MICRO_DRAFT = draft_config({"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                            "num_key_value_heads": 1, "head_dim": 8, "intermediate_size": 16, "vocab_size": 48,
                            "num_target_layers": 2, "block_size": 4, "layer_types": ["full_attention"]},
                           target_layer_ids=[0, 1], mask_token_id=47)


def test_numpy_and_cuda_backends_draft_the_same_bits(tmp_path, monkeypatch, on_gpu):
    if on_gpu:
        pytest.skip("the simulator check; on a GPU the kernels are checked by the contract")
    for module in (gemv, rmsnorm, topk):  # narrow blocks keep the simulator quick; twins read the same constants
        monkeypatch.setattr(module, "THREADS", 8)
    write_checkpoint(tmp_path / "target", MICRO, random_tensors(MICRO, 0))
    target_weights = load_weights(str(tmp_path / "target"), MICRO)
    config = DFlashConfig.from_dict(MICRO_DRAFT)
    folder = write_drafter(tmp_path / "drafter", MICRO_DRAFT, random_drafter_tensors(config))
    rng = np.random.default_rng(5)
    rows = features(rng, 3, hidden=16)
    results = []
    for backend in ("numpy", "cuda"):
        target = Model(str(tmp_path), MICRO, target_weights, None, make_backend(backend))
        drafter = load_drafter(folder, target)
        state = drafter.new_stream()
        drafter.observe(state, [target.backend.upload(f) for f in rows], position=4)
        logits = drafter.model.block_logits(state, 9, 4)
        ids, logprobs = target.backend.topk(logits, 3)
        results.append([target.backend.to_host(logits), ids, logprobs, target.backend.to_host(state.keys[0])[:3]])
    assert results[0][0].shape == (3, 48) and results[0][0].std() > 0.1
    assert [a.tobytes() for a in results[0]] == [a.tobytes() for a in results[1]]


# --- top-k and the tree -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 5, 32])
def test_topk_twin_is_the_sorted_row(k):
    rng = np.random.default_rng(k)
    logits = np.round(rng.normal(size=(4, 1000)) * 2, 1).astype(np.float32)  # many ties
    logits[1, :600] = -np.inf
    logits[2, [999, 3, 500]] = 20.0  # a tied maximum: ids 3, 500, 999 in that order
    ids, logprobs = topk.topk(logits, k)
    x = logits.astype(np.float64)
    expected = np.argsort(-x, axis=1, kind="stable")[:, :k]  # stable: equal values keep the lower id first
    assert ids.dtype == np.int32 and (ids == expected).all()
    assert list(ids[2, :min(k, 3)]) == [3, 500, 999][:k]
    top = x.max(axis=1, keepdims=True)
    log_softmax = x - top - np.log(np.exp(x - top).sum(axis=1, keepdims=True))
    assert np.abs(logprobs - np.take_along_axis(log_softmax, expected, axis=1)).max() < 1e-5


def test_topk_backend_method(target):
    logits = np.random.default_rng(0).normal(size=(3, 512)).astype(np.float32)
    ids, logprobs = target.backend.topk(logits, 4)
    assert ids.shape == logprobs.shape == (3, 4) and (ids[:, 0] == np.argmax(logits, axis=1)).all()


def path_scores(logprobs):
    """Every path of the full tree (one rank per depth, from depth 0): its score, by its tuple of ranks."""
    depths, k = logprobs.shape
    return {ranks: sum(logprobs[d, r] for d, r in enumerate(ranks))
            for depth in range(1, depths + 1) for ranks in itertools.product(range(k), repeat=depth)}


def tree_paths(ids_table, ids, parents):
    """Each node's path as its tuple of ranks."""
    paths = []
    for node, (token, parent) in enumerate(zip(ids, parents)):
        prefix = () if parent < 0 else paths[parent]
        paths.append(prefix + (list(ids_table[len(prefix)]).index(token),))
    return paths


def test_best_first_tree_by_hand():
    logprobs = np.array([[-0.1, -2.5], [-0.2, -1.0], [-0.3, -3.0]])
    ids = np.array([[10, 11], [20, 21], [30, 31]])
    assert best_first_tree(logprobs, ids, 3) == ([10, 20, 30], [-1, 0, 1])  # the chain is the best 3 paths
    assert best_first_tree(logprobs, ids, 5) == ([10, 20, 30, 21, 30], [-1, 0, 1, 0, 3])
    assert len(best_first_tree(logprobs, ids, 100)[0]) == 2 + 4 + 8  # every path, and no more
    shallow = np.array([[-0.1, -0.5], [-3.0, -4.0], [-0.1, -0.2]])
    assert best_first_tree(shallow, ids, 2) == ([10, 11], [-1, -1])  # a likely sibling beats an unlikely child
    assert best_first_tree(shallow, ids, 2, chain_first=True) == ([10, 20], [-1, 0])
    assert best_first_tree(shallow, ids, 4, chain_first=True) == ([10, 20, 30, 11], [-1, 0, 1, -1])


@pytest.mark.parametrize("budget", [1, 4, 9, 15])
def test_best_first_tree_takes_the_best_paths(budget):
    rng = np.random.default_rng(budget)
    logprobs = np.sort(np.log(rng.dirichlet(np.ones(6), size=4)), axis=1)[:, ::-1][:, :3]  # [4 depths, top 3]
    ids = np.arange(12).reshape(4, 3)
    tokens, parents = best_first_tree(logprobs, ids, budget)
    assert len(tokens) == budget and all(-1 <= p < n for n, p in enumerate(parents))
    scores = path_scores(logprobs)
    chosen = sorted(scores[path] for path in tree_paths(ids, tokens, parents))
    assert np.allclose(chosen, sorted(scores.values())[-budget:])  # the budget best paths of the whole tree
