"""Every exactness promise on an MoE model (the tiny MoE config): prompt rows == one-row steps, a window beside
another stream == one-row steps, drafted == undrafted, concurrent == solo. Rows of one round pick different
experts, so each promise also says that a row's bits do not depend on which rows share its experts. Each has a
planted control: a grouped GEMM whose sums depend on how many rows an expert gets (planted in the twins).

The models run on the twins; under --gpu the MLX 4-bit one runs on the GPU (the bf16 one stays on the twins: the
cuda backend takes affine experts only)."""
import hashlib

import numpy as np
import pytest

import tensorfold
from tensorfold.cuda import experts as grouped
from tensorfold.drafters import Drafter, NgramDrafter
from tensorfold.engine import Engine, SamplingParams
from tensorfold.model import moe
from tensorfold.model.rows import Window
from tensorfold.model.tiny import TINY_MOE_CONFIG, make_tiny
from test_lanes import OracleDrafter  # every fourth guess wrong here


def sha(ids):
    return hashlib.sha256(np.asarray(ids, "<i4").tobytes()).hexdigest()


@pytest.fixture(scope="module", params=["mlx4", "hf"])
def folder(request, tmp_path_factory):
    folder = str(tmp_path_factory.mktemp(f"moe_{request.param}"))
    make_tiny(folder, seed=21, fmt=request.param, config=TINY_MOE_CONFIG)
    return folder


@pytest.fixture(scope="module")
def model(folder, on_gpu):
    return tensorfold.load(folder, backend="cuda" if on_gpu and "mlx4" in folder else "numpy")


@pytest.fixture
def twin_model(folder):
    """A model of its own on the twins, for a control to be planted in."""
    return tensorfold.load(folder, backend="numpy")


def host(model, logits):
    return model.backend.to_host(logits)


def one_row_steps(model, ids):
    state = model.net.new_state()
    return np.concatenate([host(model, model.net.forward([t], state)) for t in ids])


def row_count_dependent(model, monkeypatch):
    """Plant the control: each expert's rows summed by BLAS in float64 when it has more than one (a grouped GEMM
    whose order follows the group), its lone rows through the real GEMM."""
    real = model.backend.linear

    def grouped_linear(x, weight):
        if len(x) == 1:
            return real(x, weight)
        return (x.astype(np.float64) @ weight.dense().T.astype(np.float64)).astype(np.float32)

    def routed(x, ids, experts):
        return grouped.routed_experts(x, ids, experts.gate_up_views, experts.down_views, grouped_linear,
                                      experts.shared)

    monkeypatch.setattr(model.backend, "routed_experts", routed)


def test_the_shared_expert_folded_in_gives_its_own_bits(folder, monkeypatch):
    """MLX 4-bit: the shared expert has the routed experts' form and width, so it runs as their stacks' last expert
    (model/moe.py). The same checkpoint with the shared expert run on its own gives the same logits, bit for bit;
    the bf16 checkpoint's experts are not affine, and the fold is not taken."""
    folded = tensorfold.load(folder, backend="numpy")
    assert folded.net.experts["layers.0.mlp."].shared == ("mlx4" in folder)
    monkeypatch.setattr(moe, "folds", lambda *args: False)
    apart = tensorfold.load(folder, backend="numpy")
    assert not apart.net.experts["layers.0.mlp."].shared
    ids = np.random.default_rng(5).integers(0, folded.config.vocab_size, 24)
    assert folded.logits(ids).tobytes() == apart.logits(ids).tobytes()


def test_control_a_fold_that_reads_the_shared_rank_from_another_expert_is_caught(tmp_path, monkeypatch):
    """Control: the folded rank k taken from expert 0 instead of the last (the shared one)."""
    make_tiny(str(tmp_path), seed=21, fmt="mlx4", config=TINY_MOE_CONFIG)
    model = tensorfold.load(str(tmp_path), backend="numpy")
    assert model.net.experts["layers.0.mlp."].shared
    ids = np.random.default_rng(5).integers(0, model.config.vocab_size, 24)
    expected = model.logits(ids)
    monkeypatch.setattr(grouped, "with_shared", lambda ids, experts, shared: np.concatenate(
        [ids, np.zeros((len(ids), 1), ids.dtype)], axis=1) if shared else ids)
    assert model.logits(ids).tobytes() != expected.tobytes()


def test_rows_of_a_round_pick_different_experts(twin_model):
    """What makes the promises below say something about routing: one prompt's rows spread over the experts."""
    model = twin_model
    x = np.random.default_rng(0).normal(size=(64, model.config.hidden_size)).astype(np.float32)
    logits, _ = model.net.project(x, "layers.0.mlp.")
    ids, weights = model.backend.route(logits, model.config.num_experts_per_tok)
    assert len(set(ids.reshape(-1).tolist())) == model.config.num_experts
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("length", [1, 33, 130])
def test_moe_prompt_rows_equal_one_row_steps(model, length):
    ids = np.random.default_rng(length).integers(0, model.config.vocab_size, length)
    whole = model.logits(ids)
    assert whole.tobytes() == one_row_steps(model, ids).tobytes()
    state = model.net.new_state()
    cut = length // 3
    chunks = np.concatenate([host(model, model.net.forward(ids[:cut], state)),
                             host(model, model.net.forward(ids[cut:], state))]) if cut else whole
    assert whole.tobytes() == chunks.tobytes()


def test_control_moe_grouped_gemm_that_follows_the_group_is_caught(twin_model, monkeypatch):
    model = twin_model
    ids = np.random.default_rng(3).integers(0, model.config.vocab_size, 40)
    expected = one_row_steps(model, ids)
    row_count_dependent(model, monkeypatch)
    assert model.logits(ids).tobytes() != expected.tobytes()


@pytest.mark.parametrize("rows", [1, 5])
def test_moe_window_beside_a_long_stream_equals_one_row_steps(model, rows):
    rng = np.random.default_rng(rows)
    ids, other = list(rng.integers(0, 500, 20 + rows)), list(rng.integers(0, 500, 80))
    expected = one_row_steps(model, ids)
    mine, theirs = model.net.new_state(), model.net.new_state()
    model.net.forward(ids[:20], mine)
    model.net.forward(other[:30], theirs)
    got, _ = model.net.forward_round([Window(mine, ids[20:]), Window(theirs, other[30:])])
    assert host(model, got).tobytes() == expected[20:].tobytes()


PROMPTS = ["ROMEO:\n", "JULIET:\nO Romeo, Romeo", "KING HENRY:\nOnce more unto the breach", "HAMLET:\nTo be"]


def run(model, prompts, params, parallel, drafter):
    engine = Engine(model, parallel=parallel, drafter=drafter, chunk=16)
    requests = [engine.submit(p, params) for p in prompts]
    while engine.run_round():
        pass
    return requests


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=0.9, top_p=0.95, seed=5)])
def test_moe_drafted_equals_undrafted_and_concurrent_equals_solo(model, sampling):
    prompts = [model.tokenizer.encode(p) for p in PROMPTS]
    solo = [model.generate(p, 24, stop_ids=(), **sampling) for p in prompts]
    params = SamplingParams(max_tokens=24, stop_ids=(), **sampling)
    oracle = OracleDrafter(prompts, solo, wrong_every=4)
    for drafter in (Drafter(), NgramDrafter(), oracle):
        requests = run(model, prompts, params, parallel=4, drafter=drafter)
        assert [sha(r.output) for r in requests] == [sha(o) for o in solo], drafter.name
    assert all(0 < r.stats.accepted < r.stats.drafted for r in requests)


def decode_round_logits(model, prompts):
    """One decode row for each of the prompts' streams, all in one round (each stream's prompt run first)."""
    states = [model.net.new_state() for _ in prompts]
    for state, prompt in zip(states, prompts):
        model.net.forward(prompt[:-1], state)
    return np.concatenate([host(model, logits) for logits in model.net.forward_round(
        [Window(s, p[-1:]) for s, p in zip(states, prompts)])])


def test_moe_concurrent_round_equals_solo(model):
    """Four streams' decode rows in one round (several share an expert) against each stream's own last step."""
    prompts = [model.tokenizer.encode(p) for p in PROMPTS]
    solo = np.concatenate([one_row_steps(model, p)[-1:] for p in prompts])
    assert decode_round_logits(model, prompts).tobytes() == solo.tobytes()


def test_control_moe_concurrent_round_with_a_group_dependent_gemm_is_caught(twin_model, monkeypatch):
    """Control: the grouped GEMM above changes the rows that share an expert."""
    model = twin_model
    prompts = [model.tokenizer.encode(p) for p in PROMPTS]
    solo = np.concatenate([one_row_steps(model, p)[-1:] for p in prompts])
    row_count_dependent(model, monkeypatch)
    assert decode_round_logits(model, prompts).tobytes() != solo.tobytes()
