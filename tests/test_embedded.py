"""The embedded default model: it loads fast, it is the model transformers sees, and its greedy text is pinned."""
import hashlib
import time

import numpy as np
import pytest

import tensorfold
from tensorfold.cli.main import main
from tensorfold.model.writer import dense_tensors, write_checkpoint
from tensorfold.models import DEFAULT_MODEL

torch = pytest.importorskip("torch", reason="the reference extra (torch, transformers) is part of `.[test]`")
transformers = pytest.importorskip("transformers")

# sha256 of the little-endian int32 ids of the greedy 32-token continuation of "ROMEO:\n" (numpy backend).
GOLDEN_GREEDY_SHA256 = "f2dc47c7f133bd706f94d25ba39adf7c49ff9eebee76173ce9b14245a6a7b6d2"


def token_sha256(ids) -> str:
    return hashlib.sha256(np.asarray(ids, "<i4").tobytes()).hexdigest()


@pytest.fixture(scope="module")
def model():
    return tensorfold.load(DEFAULT_MODEL, backend="numpy")


def test_loads_in_under_a_second():
    tensorfold.load(DEFAULT_MODEL, backend="numpy")  # imports and file cache warm
    started = time.perf_counter()
    tensorfold.load(DEFAULT_MODEL, backend="numpy")
    assert time.perf_counter() - started < 1.0


def test_it_is_the_4bit_model_and_stays_packed(model):
    assert model.net.weights["embed_tokens.weight"].kind == "affine" and model.config.tie_word_embeddings
    assert model.weight_bytes < 6e6  # 7.9M parameters at about 4.6 bits each


def test_logits_match_transformers_on_the_dequantized_weights(model, tmp_path):
    write_checkpoint(tmp_path, model.config, dense_tensors(model.net.weights), "hf-f32", tokenizer_from=model.path)
    reference = transformers.Qwen3_5ForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = model.tokenizer.encode("ROMEO:\nBut, soft! what light through yonder window breaks?\nJULIET:\n")
    with torch.no_grad():
        theirs = reference(torch.tensor(ids)[None]).logits[0].numpy()
    ours = model.logits(ids)
    assert np.abs(ours - theirs).max() <= 1e-4 * np.abs(theirs).max()
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


def test_greedy_continuation_is_golden(model):
    out = model.generate(model.tokenizer.encode("ROMEO:\n"), 32)
    assert token_sha256(out) == GOLDEN_GREEDY_SHA256
    assert token_sha256(out[:-1] + [out[-1] + 1]) != GOLDEN_GREEDY_SHA256  # control: one token off changes it


def test_generate_uses_it_by_default(capsys):
    assert main(["generate", "--prompt", "ROMEO:", "--max-tokens", "12", "--backend", "numpy"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("ROMEO:") and len(text.split()) > 3
