"""The block drafter in lane rounds: the embedded model with the DFlash drafter shipped beside it. Drafted output
equals undrafted output, chains and trees, greedy and seeded, one stream and four; the drafter's guesses are
accepted often enough to matter. Under `pytest --gpu` the same checks run on the cuda backend."""
import hashlib
import os
from types import SimpleNamespace

import numpy as np
import pytest

import tensorfold
from tensorfold.drafters import make_drafter
from tensorfold.engine import Engine, SamplingParams
from tensorfold.model.cache import StreamState
from tensorfold.models import DEFAULT_MODEL

PROMPTS = ["ROMEO:\n", "JULIET:\nO Romeo, Romeo", "KING HENRY:\nOnce more unto the breach, dear friends",
           "HAMLET:\nTo be, or not to be"]
TOKENS = 16
DRAFTER = os.path.join(DEFAULT_MODEL, "drafter")  # the block drafter shipped beside the embedded model
SAMPLINGS = {"greedy": dict(temperature=0.0), "seeded": dict(temperature=0.9, top_p=0.95, seed=11)}
LEAST_TAU = {"greedy": 2.0, "seeded": 1.3}  # tokens per drafted round; chance would give about 1


def sha(ids):
    return hashlib.sha256(np.asarray(ids, "<i4").tobytes()).hexdigest()


@pytest.fixture(scope="module")
def model(on_gpu):
    return tensorfold.load(DEFAULT_MODEL, backend="cuda" if on_gpu else "numpy")


@pytest.fixture(scope="module")
def prompts(model):
    return [model.tokenizer.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def solo(model, prompts):
    """Each prompt generated alone, without drafts: sampling name -> output hashes."""
    return {name: [sha(model.generate(p, TOKENS, stop_ids=(), **sampling)) for p in prompts]
            for name, sampling in SAMPLINGS.items()}


def run(model, prompts, drafter, parallel, sampling):
    engine = Engine(model, parallel=parallel, drafter=drafter, context=512)
    requests = [engine.submit(p, SamplingParams(max_tokens=TOKENS, stop_ids=(), **sampling)) for p in prompts]
    while engine.run_round():
        pass
    return requests


def test_auto_is_the_models_own_block_drafter(model, tmp_path):
    """"auto" makes the model's own block drafter, on every backend (the engine's gate decides which rounds draft);
    the n-gram drafter for a model without one (the control: the same call, another folder)."""
    assert make_drafter("auto", model).name == "dflash"
    assert make_drafter("auto", SimpleNamespace(path=str(tmp_path), backend=model.backend)).name == "ngram"
    assert make_drafter(DRAFTER, model).name == "dflash"


@pytest.mark.parametrize("shape, sampling, parallel", [
    ("chain", "greedy", 1), ("chain", "greedy", 4), ("chain", "seeded", 4),
    ("tree", "greedy", 4), ("tree", "seeded", 1), ("tree", "seeded", 4)])
def test_block_drafts_equal_undrafted(model, prompts, solo, shape, sampling, parallel):
    drafter = make_drafter(DRAFTER, model, shape)
    chosen = prompts if parallel > 1 else prompts[:2]  # one stream at a time: two prompts keep the test short
    requests = run(model, chosen, drafter, parallel, SAMPLINGS[sampling])
    assert [sha(r.output) for r in requests] == solo[sampling][:len(chosen)]
    drafted_rounds = sum(r.stats.draft_rounds for r in requests)
    tau = (sum(r.stats.accepted for r in requests) + drafted_rounds) / drafted_rounds
    assert tau > LEAST_TAU[sampling], f"mean acceptance length {tau:.2f}: the drafter should beat chance by far"


def test_control_a_tree_kept_in_slot_order_is_caught(model, prompts, solo, monkeypatch):
    """Control: keeping a tree's first rows in slot order instead of the accepted path changes the output."""
    real_keep_path = StreamState.keep_path
    monkeypatch.setattr(StreamState, "keep_path", lambda self, path: real_keep_path(self, list(range(len(path)))))
    requests = run(model, prompts, make_drafter(DRAFTER, model, "tree"), 4, SAMPLINGS["greedy"])
    assert [sha(r.output) for r in requests] != solo["greedy"]


def test_control_features_in_the_wrong_order_cost_acceptance_not_exactness(model, prompts, solo, monkeypatch):
    """The drafter only guesses: fed its tapped layers in the wrong order its guesses get worse, yet the output
    stays the undrafted output. This is what makes any drafter safe to plug in."""
    drafter = make_drafter(DRAFTER, model, "chain")
    honest = run(model, prompts[:1], drafter, 1, SAMPLINGS["greedy"])[0]
    real_observe = drafter.observe
    monkeypatch.setattr(drafter, "observe", lambda state, features, position, kept=None: real_observe(
        state, features[::-1], position, kept))
    confused = run(model, prompts[:1], drafter, 1, SAMPLINGS["greedy"])[0]
    assert sha(confused.output) == sha(honest.output) == solo["greedy"][0]
    assert confused.stats.accepted < honest.stats.accepted


def test_a_resumed_prompt_drafts_as_a_fresh_one(model, monkeypatch):
    """The prompt cache keeps the drafter's context with the stream's state: a resumed request gets the same
    drafts, hence the same rounds, as a fresh one, and the same output. Control: a resume that drops the drafter's
    context drafts differently."""
    from tensorfold.prompt_cache import PromptCache
    prompt = model.tokenizer.encode("ROMEO:\nBut, soft! what light through yonder window breaks?\nJULIET:\n" * 2)
    drafter = make_drafter(DRAFTER, model, "chain")

    def twice():
        engine = Engine(model, parallel=1, drafter=drafter, chunk=16, prompt_cache=PromptCache(64 << 20, 16))
        results = []
        for _ in range(2):
            request = engine.submit(prompt, SamplingParams(max_tokens=TOKENS, stop_ids=()))
            while engine.run_round():
                pass
            results.append(request)
        return results

    fresh, resumed = twice()
    assert resumed.stats.cached_tokens > 0
    assert resumed.output == fresh.output
    assert (resumed.stats.drafted, resumed.stats.accepted) == (fresh.stats.drafted, fresh.stats.accepted)
    monkeypatch.setattr(drafter, "restore", lambda saved, into=None: drafter.new_stream())
    fresh, forgetful = twice()
    assert forgetful.output == fresh.output
    assert (forgetful.stats.drafted, forgetful.stats.accepted) != (fresh.stats.drafted, fresh.stats.accepted)


def test_bench_drafter_checks_exactness_and_reports_acceptance(tmp_path, capsys):
    import json

    from tensorfold.cli.main import main
    out = tmp_path / "drafter.json"
    assert main(["bench", "drafter", "--backend", "numpy", "--tokens", "6", "--prompts", "1", "--draft-rows", "4",
                 "--json", str(out)]) == 0
    assert "DIFFERS" not in capsys.readouterr().out
    results = json.loads(out.read_text())["results"]
    assert results["greedy tree"]["tau"] > 1 and results["greedy none"]["tau"] is None
    assert results["greedy chain"]["recordings"] is None  # the numpy backend replays nothing
    assert results["greedy auto"]["hashes"] == results["greedy none"]["hashes"]  # the gated chains, compared too


def test_bench_drafter_phases_cover_the_decode_rounds_and_leave_the_model_unwrapped(model):
    from tensorfold.cli.bench.drafter import PHASES, decode
    drafter = make_drafter(DRAFTER, model, "chain")
    prompt = model.tokenizer.encode("ROMEO:\n")
    plain = decode(model, drafter, [prompt], 8, {"temperature": 0.0})
    timed = decode(model, drafter, [prompt], 8, {"temperature": 0.0}, phases=True)
    assert timed["hashes"] == plain["hashes"]  # the clock changes nothing the rounds compute
    ms = timed["phases_ms"]
    assert list(ms) == [*PHASES, "other"] and ms["forward"] > 0 and ms["other"] >= 0
    assert "forward_logits" not in vars(model.net)  # the model's own method again
