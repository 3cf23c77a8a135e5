"""A prompt pass and one-row steps give the same logits bytes, whatever the chunking of the prompt.

The checks run on the session's lane models (conftest.py): the tiny checkpoints on the twins, or under --gpu
Qwen3.5-0.8B's shapes on the GPU."""
import numpy as np
import pytest

import tensorfold


def stepwise_logits(model, ids, chunks):
    """Logits of `ids` run as consecutive windows of the given sizes through one stream."""
    state = model.net.new_state()
    out, start = [], 0
    for size in chunks:
        out.append(model.backend.to_host(model.net.forward(ids[start:start + size], state)))
        start += size
    assert start == len(ids)
    return np.concatenate(out)


@pytest.mark.parametrize("length", [31, 32, 33, 40, 64, 128, 129, 200, 300])
def test_prompt_rows_equal_one_row_steps(lanes_model, length):
    model = lanes_model
    ids = np.random.default_rng(length).integers(0, model.config.vocab_size, length)
    whole = model.logits(ids)
    steps = stepwise_logits(model, ids, [1] * length)
    assert whole.tobytes() == steps.tobytes()
    mixed = stepwise_logits(model, ids, [length // 3, 1, length - length // 3 - 1] if length > 2 else [length])
    assert whole.tobytes() == mixed.tobytes()


def test_mlx_prompt_rows_equal_one_row_steps(lanes_mlx4_model):
    model = lanes_mlx4_model
    ids = np.random.default_rng(5).integers(0, model.config.vocab_size, 140)
    assert model.logits(ids).tobytes() == stepwise_logits(model, ids, [1] * 140).tobytes()


def test_control_row_count_dependent_gemv_is_caught(tiny_hf, monkeypatch):
    """Control: a GEMV whose sums depend on how many rows run together (BLAS) breaks the equality."""
    model = tensorfold.load(tiny_hf, backend="numpy")  # twins only: the fault replaces the NumPy GEMV
    ids = np.random.default_rng(3).integers(0, model.config.vocab_size, 64)

    def blas_linear(x, weight):
        dense = weight.dense()
        return np.concatenate([x[:1] @ dense.T, (x[1:].astype(np.float64) @ dense.T).astype(np.float32)])

    monkeypatch.setattr(model.backend, "linear", blas_linear)
    assert model.logits(ids).tobytes() != stepwise_logits(model, ids, [1] * 64).tobytes()


def test_control_window_dependent_attention_chunks_are_caught(tiny_hf, monkeypatch):
    """Control: cutting attention chunks relative to the window instead of at fixed positions breaks equality."""
    from tensorfold.cuda import attention
    model = tensorfold.load(tiny_hf, backend="numpy")  # twins only: the fault is planted in the NumPy attention
    ids = np.random.default_rng(4).integers(0, model.config.vocab_size, 150)
    whole = model.logits(ids)
    original = attention.attention_partial

    def shifted_partial(q, keys, values, n_keys, scale, *maps, max_keys=None):
        attention.CHUNK = 128 if len(q) > 1 else 64  # the chunk width follows the window: the review's blocker
        try:
            return original(q, keys, values, n_keys, scale, *maps)
        finally:
            attention.CHUNK = 128

    monkeypatch.setattr(model.backend, "attention_partial", shifted_partial)
    assert whole.tobytes() != stepwise_logits(model, ids, [1] * 150).tobytes()
