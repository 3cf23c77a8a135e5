"""The engine draws every row of a round in one backend call (on the GPU under --gpu): a drafted row is drawn for
the output position it would have if the walk reaches it, len(output) + its depth, so drafted output still equals
undrafted. Requests with penalties or logprobs draw on the host, in the same rounds. Each check has a planted
control that moves the positions the way a bug would.

The model is the embedded one, trained, on the lane tests' backend: its sampled tokens depend on the draw (a
random-weight model's distributions can be too peaked for a moved draw to show)."""
import numpy as np
import pytest
from test_lanes import PROMPTS, OracleDrafter, OracleTreeDrafter

import tensorfold
from tensorfold import engine as engine_module
from tensorfold.engine import Engine, SamplingParams
from tensorfold.models import DEFAULT_MODEL

SAMPLING = dict(temperature=0.9, top_p=0.95, seed=21)
TOKENS = 16


@pytest.fixture(scope="module")
def model(lanes_backend):
    return tensorfold.load(DEFAULT_MODEL, backend=lanes_backend)


@pytest.fixture(scope="module")
def prompts_and_solo(model):
    prompts = [model.tokenizer.encode(p) for p in PROMPTS[:2]]
    return prompts, [model.generate(p, TOKENS, stop_ids=(), **SAMPLING) for p in prompts]


def run(model, prompts, drafter, parallel=1, **extra):
    engine = Engine(model, parallel=parallel, drafter=drafter)
    requests = [engine.submit(p, SamplingParams(max_tokens=TOKENS, stop_ids=(), **SAMPLING, **extra)) for p in prompts]
    while engine.run_round():
        pass
    return requests


def plant(monkeypatch, positions):
    """Route the output positions of every round's batched draws through `positions(original) -> planted`, where the
    engine computes them (`draw_parameters`): an eager round hands them to `sample_rows`, a replayed round (on a GPU)
    writes them for the draws inside its recording."""
    original = engine_module.draw_parameters

    def planted(batch):
        seeds, where, *params = original(batch)
        return (seeds, positions(where).astype(where.dtype), *params)
    monkeypatch.setattr(engine_module, "draw_parameters", planted)


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_batched_draws_equal_solo(model, prompts_and_solo, shape):
    prompts, solo = prompts_and_solo
    drafter = (OracleDrafter if shape == "chain" else OracleTreeDrafter)(prompts, solo)
    requests = run(model, prompts, drafter, parallel=2)
    assert [r.output for r in requests] == solo
    assert all(r.stats.accepted > 0 for r in requests)  # drafted rows were drawn and accepted


def test_control_drafted_rows_drawn_one_position_late_are_caught(model, prompts_and_solo, monkeypatch):
    prompts, solo = prompts_and_solo
    plant(monkeypatch, lambda where: where + (np.arange(len(where)) > 0))  # every row after a window's first
    requests = run(model, prompts, OracleDrafter(prompts, solo))
    assert [r.output for r in requests] != solo


def test_control_tree_rows_drawn_at_their_row_index_are_caught(model, prompts_and_solo, monkeypatch):
    prompts, solo = prompts_and_solo
    plant(monkeypatch, lambda where: where[0] + np.arange(len(where), dtype=where.dtype))  # not the depth
    requests = run(model, prompts, OracleTreeDrafter(prompts, solo))
    assert [r.output for r in requests] != solo


def test_host_draws_beside_batched_draws(model, prompts_and_solo):
    """A request with logprobs draws on the host in the same rounds as one drawing on the backend: both equal solo,
    and the logprobs belong to the tokens drawn."""
    prompts, solo = prompts_and_solo
    engine = Engine(model, parallel=2, drafter=OracleDrafter(prompts, solo))
    plain = engine.submit(prompts[0], SamplingParams(max_tokens=TOKENS, stop_ids=(), **SAMPLING))
    with_logprobs = engine.submit(prompts[1], SamplingParams(max_tokens=TOKENS, stop_ids=(), logprobs=2, **SAMPLING))
    while engine.run_round():
        pass
    assert [plain.output, with_logprobs.output] == solo
    assert len(with_logprobs.logprobs) == TOKENS
    assert all(logprob <= 0 and len(top) == 2 for logprob, top in with_logprobs.logprobs)


def test_a_round_of_every_stream_draws_from_the_logits_as_they_are(model, monkeypatch):
    """When every stream of a round is drawn on the device, the draws read the round's logits as the head wrote them
    (`Qwen35.forward_logits`: the same array, no gathering); while a stream is still being fed its prompt, the
    others' rows are gathered first. The identity check is its own control: it fails in the gathered rounds."""
    made, seen = [], []  # each round's logits; for each draw, (identical to its round's logits, all rows drawn)
    forward, sample = model.net.forward_logits, model.backend.sample_rows

    def recording_forward(*args, **kwargs):
        logits, starts = forward(*args, **kwargs)
        made.append(logits)
        return logits, starts

    def recording_sample(logits, seeds, *params):
        seen.append((logits is made[-1], len(seeds) == made[-1].shape[0]))
        return sample(logits, seeds, *params)
    monkeypatch.setattr(model.net, "forward_logits", recording_forward)
    monkeypatch.setattr(model.backend, "sample_rows", recording_sample)
    engine = Engine(model, parallel=2, chunk=8, graphs=False)  # eager rounds: each runs forward_logits
    engine.submit([5, 6, 7], SamplingParams(max_tokens=6, stop_ids=()))
    engine.submit(list(range(10, 40)), SamplingParams(max_tokens=2, stop_ids=()))  # a prompt of four chunks
    while engine.run_round():
        pass
    assert all(identical == every_row for identical, every_row in seen)
    assert {identical for identical, _ in seen} == {True, False}  # both kinds of round ran
