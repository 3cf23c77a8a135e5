"""tensorfold's logits against transformers' Qwen3_5ForCausalLM in float32 on the same weights."""
import numpy as np
import pytest

import tensorfold

torch = pytest.importorskip("torch", reason="the reference extra (torch, transformers) is part of `.[test]`")
transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4  # max |diff| <= TOLERANCE * max |logit|; measured: about 1e-5 at 300 tokens
PROMPT_LENGTHS = (1, 2, 33, 129, 300)


def reference_logits(folder, ids):
    model = transformers.Qwen3_5ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor(np.asarray(ids))[None]).logits[0].numpy()


def relative_error(ours, theirs):
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


@pytest.mark.parametrize("name", ["gqa", "tied", "wide"])
def test_logits_match_transformers(checkpoints, name):
    model = tensorfold.load(checkpoints[name], backend="numpy")
    ids = np.random.default_rng(1).integers(0, model.config.vocab_size, max(PROMPT_LENGTHS))
    for n in PROMPT_LENGTHS:
        error = relative_error(model.logits(ids[:n]), reference_logits(checkpoints[name], ids[:n]))
        assert error <= TOLERANCE, f"{name}, {n} tokens: relative error {error:.2e}"


@pytest.mark.parametrize("fmt", ["mlx4", "mlx8"])
def test_affine_logits_match_transformers_on_the_dequantized_weights(tmp_path, fmt):
    """An MLX checkpoint (its linear layers through the exact integer GEMM) against transformers on the same weights
    dequantized into a float32 checkpoint: the same bar as the float checkpoints."""
    from tensorfold.model.tiny import make_tiny
    make_tiny(tmp_path / "mlx", seed=5, fmt=fmt)
    assert_matches_dequantized(tensorfold.load(str(tmp_path / "mlx"), backend="numpy"), tmp_path / "dense", fmt)


def assert_matches_dequantized(model, folder, fmt, reference=reference_logits, lengths=PROMPT_LENGTHS):
    """The model's logits against `reference`'s (transformers) on its weights dequantized into a float32
    checkpoint at `folder`, at every prompt length, within the bar."""
    from tensorfold.model.writer import dense_tensors, write_checkpoint
    write_checkpoint(folder, model.config, dense_tensors(model.net.weights), "hf-f32", tokenizer_from=model.path)
    ids = np.random.default_rng(2).integers(0, model.config.vocab_size, max(lengths))
    for n in lengths:
        error = relative_error(model.logits(ids[:n]), reference(str(folder), ids[:n]))
        assert error <= TOLERANCE, f"{fmt}, {n} tokens: relative error {error:.2e}"


@pytest.mark.parametrize("mistake", ["plain norm weight", "gate/query order", "tiled head sharing"])
def test_reference_catches_planted_mistakes(checkpoints, mistake):
    """Controls: the mistakes the spec warns about each move the logits far past the tolerance."""
    model = tensorfold.load(checkpoints["gqa"], backend="numpy")
    w, c = model.net.weights, model.config
    if mistake == "plain norm weight":  # multiply by w instead of 1 + w
        w["layers.0.input_layernorm.weight"] = w["layers.0.input_layernorm.weight"] - np.float32(1)
    elif mistake == "gate/query order":  # all queries then all gates instead of per-head interleave
        q = w["layers.3.self_attn.q_proj.weight"]  # its rows of the layer's stacked projections: written in place
        per_head = q.data.reshape(c.num_attention_heads, 2, c.head_dim, -1)
        q.data[...] = per_head.transpose(1, 0, 2, 3).reshape(q.data.shape).copy()
    else:  # value head h reads key head h % nk instead of h // (nv / nk)
        qkv = w["layers.0.linear_attn.in_proj_qkv.weight"]
        nk, dk = c.linear_num_key_heads, c.linear_key_head_dim
        for part in range(2):  # swap the two key heads of q and of k: the tiled pairing, seen through repeat
            block = qkv.data[part * nk * dk:(part + 1) * nk * dk].reshape(nk, dk, -1)
            qkv.data[part * nk * dk:(part + 1) * nk * dk] = block[::-1].reshape(nk * dk, -1)
    ids = np.random.default_rng(1).integers(0, c.vocab_size, 33)
    error = relative_error(model.logits(ids), reference_logits(checkpoints["gqa"], ids))
    assert error > 100 * TOLERANCE, f"{mistake}: relative error only {error:.2e}"
