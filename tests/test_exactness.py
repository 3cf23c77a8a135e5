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


def test_a_long_chunk_attends_in_row_slices_with_the_same_bits(lanes_model, monkeypatch):
    """A chunk whose attention partials would pass PARTIALS_BYTES attends in slices of rows; here slices of 7 rows
    (a budget of 7 rows' partials) give the bytes of the unsliced pass. Control: a slice whose last row reads one
    key fewer changes them."""
    from tensorfold.model import qwen35
    model = lanes_model
    ids = np.random.default_rng(6).integers(0, model.config.vocab_size, 150)
    whole = model.logits(ids)
    c = model.config
    per_row = 4 * c.num_attention_heads * (c.head_dim + 2) * -(-150 // qwen35.KEYS_A_PARTIAL)
    monkeypatch.setattr(qwen35, "PARTIALS_BYTES", 7 * per_row)
    calls = []
    original = model.backend.attention_partial

    def counted(q, *args, **kwargs):
        calls.append(q.shape[0])
        return original(q, *args, **kwargs)

    monkeypatch.setattr(model.backend, "attention_partial", counted)
    assert model.logits(ids).tobytes() == whole.tobytes()
    attention_layers = c.layer_types.count("full_attention")
    assert calls == ([7] * 21 + [3]) * attention_layers  # 150 rows: 21 slices of 7 and one of 3, each layer

    def short_last_row(q, keys, values, n_keys, *args, **kwargs):
        n_keys = np.array(model.backend.to_host(n_keys) if not isinstance(n_keys, np.ndarray) else n_keys)
        n_keys[-1] -= 1
        return original(q, keys, values, model.backend.upload(n_keys.astype(np.int32)), *args, **kwargs)

    monkeypatch.setattr(model.backend, "attention_partial", short_last_row)
    assert model.logits(ids).tobytes() != whole.tobytes()
