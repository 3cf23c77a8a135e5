"""tools/train_drafter.py: the DFlash drafter it trains, its batched training forward, and its exported checkpoint."""
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the reference extra (torch, transformers) is part of `.[test]`")
pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "train_drafter.py"


VAL_TEXT = """SONNET:
Let me not to the marriage of true minds
Admit impediments. Love is not love
Which alters when it alteration finds,
Or bends with the remover to remove.
O no! it is an ever-fixed mark
That looks on tempests and is never shaken;
It is the star to every wand'ring bark,
Whose worth's unknown, although his height be taken.
"""


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("train_drafter", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tensors here are tiny: one thread beats the cost of waking several, most of all on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """train.npy and val.npy (uint16 ids) from the embedded model's tokenizer on two short texts."""
    import tensorfold
    from tensorfold.model.tiny_corpus import TINY_CORPUS  # verse and prose shipped with the package
    from tensorfold.models import DEFAULT_MODEL

    tokenizer = tensorfold.load(DEFAULT_MODEL, backend="numpy").tokenizer
    folder = tmp_path_factory.mktemp("data")
    np.save(folder / "train.npy", np.array(tokenizer.encode(TINY_CORPUS), np.uint16))
    np.save(folder / "val.npy", np.array(tokenizer.encode(VAL_TEXT), np.uint16))
    return folder


SMALL = ["--device", "cpu", "--minutes", "0.04", "--sequences", "8", "--val-sequences", "4", "--prompt-len", "8",
         "--seq-len", "40", "--seqs-per-step", "2", "--anchors", "4", "--eval-seconds", "1", "--log-steps", "5"]


@pytest.fixture(scope="module")
def trained(tool, data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("drafter")
    log = tool.main(["--data", str(data_dir), "--out", str(out), *SMALL])
    return out, log


def test_exported_config_is_the_dflash_format(trained):
    out, _ = trained
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["hidden_size"] == 256 and config["vocab_size"] == 4096
    assert (config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"],
            config["head_dim"], config["intermediate_size"]) == (2, 4, 2, 64, 768)
    assert config["layer_types"] == ["full_attention"] * 2
    assert config["attention_bias"] is False and config["tie_word_embeddings"] is False
    assert config["hidden_act"] == "silu" and config["num_target_layers"] == 8 and config["block_size"] == 16
    assert config["dflash_config"] == {"target_layer_ids": [1, 3, 5, 7], "mask_token_id": 4094}
    for key in ("rms_norm_eps", "rope_theta", "max_position_embeddings"):
        assert key in config


def test_exported_tensors_have_the_spec_names_shapes_and_dtype(trained):
    out, _ = trained
    tensors = safetensors_torch.load_file(str(out / "model.safetensors"))
    expected = {"fc.weight": (256, 4 * 256), "hidden_norm.weight": (256,), "norm.weight": (256,)}
    for i in range(2):
        expected |= {
            f"layers.{i}.input_layernorm.weight": (256,),
            f"layers.{i}.post_attention_layernorm.weight": (256,),
            f"layers.{i}.self_attn.q_proj.weight": (4 * 64, 256),
            f"layers.{i}.self_attn.k_proj.weight": (2 * 64, 256),
            f"layers.{i}.self_attn.v_proj.weight": (2 * 64, 256),
            f"layers.{i}.self_attn.o_proj.weight": (256, 4 * 64),
            f"layers.{i}.self_attn.q_norm.weight": (64,),
            f"layers.{i}.self_attn.k_norm.weight": (64,),
            f"layers.{i}.mlp.gate_proj.weight": (768, 256),
            f"layers.{i}.mlp.up_proj.weight": (768, 256),
            f"layers.{i}.mlp.down_proj.weight": (256, 768),
        }
    assert {name: tuple(t.shape) for name, t in tensors.items()} == expected
    assert len(tensors) == 3 + 11 * 2
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())


def test_training_logs_losses_and_tau(trained):
    out, log = trained
    written = json.loads((out / "train_log.json").read_text())
    assert written["training"]["steps"] > 0 and np.isfinite(written["training"]["best_val_loss"])
    assert written["training"]["history"] and written["mask_token"] == "<tool_call>"
    assert 1.0 <= written["tau"]["chain"] <= 16 and 1.0 <= written["tau"]["tree"] <= 16
    assert written["tau"]["tree_budget"] == 15 and written["tau"]["sequences"] == 2  # 2 of the 4 val sequences
    for key in ("torch", "transformers", "device", "device_name", "config", "data", "wall_seconds"):
        assert key in written
    card = (out / "README.md").read_text()
    assert "DFlashDraftModel" in card and f"{log['tau']['chain']:.2f}" in card


def test_the_exported_drafter_reloads_and_drafts_a_block(tool, trained):
    out, _ = trained
    drafter = tool.load_drafter(out)
    embedding = torch.randn(4096, 256) * 0.05
    logits = tool.draft_logits(drafter, embedding, embedding, torch.randn(7, 4 * 256), root_id=5)
    assert logits.shape == (15, 4096) and torch.isfinite(logits).all()


def test_batched_anchors_equal_one_block_each(tool):
    """The training forward (many anchors, masked) computes exactly the one-stream draft step at each anchor,
    which sees only the context rows before it."""
    torch.manual_seed(0)
    cfg = tool.DraftConfig(hidden_size=32, vocab_size=64, num_target_layers=4, target_layer_ids=[1, 3],
                           mask_token_id=63, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=8, intermediate_size=48)
    drafter = tool.DFlashDraft(cfg).eval()
    for p in drafter.parameters():  # norm weights away from 1, so that a mixed-up norm shows
        p.data.add_(0.1 * torch.randn_like(p))
    embedding = torch.randn(64, 32)
    tokens, features = torch.randint(0, 63, (2, 40)), torch.randn(2, 40, 2 * 32)
    anchors = torch.tensor([[1, 9, 24], [3, 3, 17]])
    with torch.no_grad():
        batched = tool.anchored_block_logits(drafter, embedding, embedding, tokens, features, anchors)
        for s in range(2):
            for a in range(3):
                p = int(anchors[s, a])
                single = tool.draft_logits(drafter, embedding, embedding, features[s, :p], int(tokens[s, p]))
                torch.testing.assert_close(batched[s, a], single, rtol=1e-4, atol=1e-4)
        # control: the block must depend on its context
        changed = tool.draft_logits(drafter, embedding, embedding, features[0, :9] + 1.0, int(tokens[0, 9]))
        assert (changed - batched[0, 1]).abs().max() > 1e-2


def numpy_draft_step(w: dict, cfg, embedding, features, root_id):
    """Spec 1.3 written out in NumPy, float64: one block [root, mask...] over context rows 0..P-1."""

    def rms(x, weight):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.rms_norm_eps) * weight

    def rope(x, positions):  # x [T, heads, D], neox halves
        half = x.shape[-1] // 2
        angles = positions[:, None] * cfg.rope_theta ** (-np.arange(half) / half)
        cos, sin = np.cos(angles)[:, None], np.sin(angles)[:, None]
        first, second = x[..., :half], x[..., half:]
        return np.concatenate([first * cos - second * sin, second * cos + first * sin], -1)

    P, B, D = len(features), cfg.block_size, cfg.head_dim
    context_positions, block_positions = np.arange(P), np.arange(P, P + B)
    c = rms(features @ w["fc.weight"].T, w["hidden_norm.weight"])
    x = embedding[[root_id] + [cfg.mask_token_id] * (B - 1)]
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."

        def heads(rows, proj, norm, positions):  # project, split into heads, per-head RMSNorm, then RoPE
            projected = (rows @ w[p + f"self_attn.{proj}.weight"].T).reshape(len(rows), -1, D)
            return rope(rms(projected, w[p + f"self_attn.{norm}.weight"]), positions)

        h = rms(x, w[p + "input_layernorm.weight"])
        q = heads(h, "q_proj", "q_norm", block_positions)
        k = np.concatenate([heads(c, "k_proj", "k_norm", context_positions),
                            heads(h, "k_proj", "k_norm", block_positions)])
        v = np.concatenate([c, h]) @ w[p + "self_attn.v_proj.weight"].T
        v = v.reshape(P + B, -1, D)
        group = q.shape[1] // k.shape[1]
        out = np.empty_like(q)
        for head in range(q.shape[1]):
            scores = q[:, head] @ k[:, head // group].T / np.sqrt(D)  # no mask: all rows visible
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            out[:, head] = (probs / probs.sum(-1, keepdims=True)) @ v[:, head // group]
        x = x + out.reshape(B, -1) @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    return rms(x, w["norm.weight"])[1:] @ embedding.T


def test_draft_step_matches_the_spec_written_in_numpy(tool):
    torch.manual_seed(1)
    cfg = tool.DraftConfig(hidden_size=32, vocab_size=64, num_target_layers=4, target_layer_ids=[0, 2],
                           mask_token_id=62, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=8, intermediate_size=48)
    drafter = tool.DFlashDraft(cfg).eval()
    for p in drafter.parameters():
        p.data.add_(0.1 * torch.randn_like(p))
    embedding, features = torch.randn(64, 32), torch.randn(11, 2 * 32)
    with torch.no_grad():
        ours = tool.draft_logits(drafter, embedding, embedding, features, root_id=7).double().numpy()
    weights = {name: t.double().numpy() for name, t in drafter.state_dict().items()}
    theirs = numpy_draft_step(weights, cfg, embedding.double().numpy(), features.double().numpy(), 7)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)
    assert ours.shape == (cfg.block_size - 1, 64)


def test_tapped_states_are_layer_outputs(tool):
    """Layer l's output is transformers' hidden_states[l+1], except for the last layer, whose entry there is
    final-normed."""
    from tensorfold.models import DEFAULT_MODEL

    target, tokenizer = tool.load_target(DEFAULT_MODEL, torch.device("cpu"))
    ids = torch.tensor([tokenizer.encode("ROMEO:\nBut, soft! what light through yonder window breaks?\n")])
    features = tool.target_features(target, ids, [1, 3, 7], batch=1)
    with torch.no_grad():
        states = target(ids, output_hidden_states=True).hidden_states
    torch.testing.assert_close(features[..., :256], states[2])
    torch.testing.assert_close(features[..., 256:512], states[4])
    assert not torch.allclose(features[..., 512:], states[8], atol=1e-3)  # control: hidden_states[8] is normed
    final_norm = target.model.norm(features[..., 512:])
    torch.testing.assert_close(final_norm, states[8])


def test_tree_from_marginals(tool):
    # depth 1: "a" is sure; depth 2: "b" 0.5 / "c" 0.4; depth 3: "d" 0.9
    logprobs = np.log(np.array([[0.99, 0.01], [0.5, 0.4], [0.9, 0.05]]))
    tokens = np.array([[10, 11], [20, 21], [30, 31]])
    ids, parents, depths = tool.best_first_tree(logprobs, tokens, budget=4)
    # paths by score: a (.99), a-b (.495), a-b-d (.446), a-c (.396)
    assert ids == [10, 20, 30, 21] and parents == [0, 1, 2, 1] and depths == [1, 2, 3, 2]
    assert tool.accepted_in_tree(ids, parents, np.array([10, 21, 30])) == 2  # a, c; c has no child yet
    assert tool.accepted_in_tree(ids, parents, np.array([10, 20, 30])) == 3
    assert tool.accepted_in_tree(ids, parents, np.array([11, 20, 30])) == 0
    chain, chain_parents, _ = tool.best_first_tree(np.log(np.full((3, 2), [0.9, 0.1])), tokens, budget=3)
    assert chain == [10, 20, 30] and chain_parents == [0, 1, 2]  # confident marginals give the chain


def test_a_mask_token_in_the_corpus_is_refused(tool, tmp_path):
    np.save(tmp_path / "train.npy", np.array([5, 4094, 6], np.uint16))
    np.save(tmp_path / "val.npy", np.array([5, 6, 7], np.uint16))
    with pytest.raises(SystemExit, match="4094"):
        tool.main(["--data", str(tmp_path), "--out", str(tmp_path / "out"), *SMALL])
