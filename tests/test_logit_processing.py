"""The logit processing before a draw (`tensorfold/sampling.py`: logit_bias, repetition_penalty, the presence and
frequency penalties), stop_token_ids and the prompt's log-probabilities, in the engine.

Each setting changes a row's logits by the row's token history, so a drafted row must be processed exactly as the
one-row step it stands for: drafted == undrafted is checked for each, with drafts that are mostly right (an oracle,
so that many are accepted) and with the embedded model's own block drafter; the controls draw the drafted rows
(every row after a window's first) without the setting, and must differ. The model is the embedded one, trained:
its sampled tokens follow the processing closely."""
import dataclasses
import os

import numpy as np
import pytest
from test_lanes import PROMPTS, OracleDrafter, OracleTreeDrafter

import tensorfold
from tensorfold.drafters import make_drafter
from tensorfold.engine import Engine
from tensorfold.models import DEFAULT_MODEL
from tensorfold.prompt_cache import PromptCache
from tensorfold.sampling import (SamplingParams, TokenHistory, log_probabilities, process_logits,
                                 prompt_log_probabilities)

SAMPLING = dict(temperature=0.9, top_p=0.95, seed=21)
TOKENS = 12
MAX_DRAFT = 4  # drafted rows per window: enough to accept several in a row, few enough to keep rounds short


@pytest.fixture(scope="module")
def model(lanes_backend):
    return tensorfold.load(DEFAULT_MODEL, backend=lanes_backend)


@pytest.fixture(scope="module")
def prompts(model):
    return [model.tokenizer.encode(p) for p in PROMPTS[:2]]


def run(model, prompts, settings, drafter=None, parallel=1, tokens=TOKENS, sampling=SAMPLING, draft=True):
    """Each prompt's request with `settings` (one dict for all, or one per prompt), run to its end."""
    per_prompt = settings if isinstance(settings, list) else [settings] * len(prompts)
    engine = Engine(model, parallel=parallel, drafter=drafter, max_draft=MAX_DRAFT)
    requests = [engine.submit(p, SamplingParams(max_tokens=tokens, stop_ids=s.pop("stop_ids", ()), draft=draft,
                                                **sampling, **s))
                for p, s in zip(prompts, [dict(s) for s in per_prompt])]
    while engine.run_round():
        pass
    return requests


def outputs(requests) -> list:
    return [r.output for r in requests]


@pytest.fixture(scope="module")
def plain(model, prompts):
    """Each prompt's undrafted output without any setting."""
    return [run(model, [p], {}, draft=False)[0].output for p in prompts]


@pytest.fixture(scope="module")
def settings(model, prompts, plain):
    """Each setting under test, chosen from the first prompt's plain output so that it changes it: a bias against
    its most frequent token and for the second most likely first token, a repetition penalty, a stop id met half
    way, the presence and frequency penalties, and all of them at once."""
    ids, counts = np.unique(plain[0], return_counts=True)
    frequent = int(ids[np.argmax(counts)])
    second = int(np.argsort(-model.logits(prompts[0])[-1], kind="stable")[1])
    found = {"logit_bias": dict(logit_bias={frequent: -100.0, second: 4.5}),
             "repetition_penalty": dict(repetition_penalty=1.4),
             "stop_token_ids": dict(stop_ids=(plain[0][TOKENS // 2],)),
             "penalties": dict(presence_penalty=2.0, frequency_penalty=2.0)}
    found["all"] = {key: value for setting in found.values() for key, value in setting.items()}
    return found


@pytest.fixture(scope="module")
def solo(model, prompts, plain, settings):
    """Each setting's undrafted output of the first prompt, which each setting changes."""
    found = {name: [run(model, prompts[:1], setting, draft=False)[0].output] for name, setting in settings.items()}
    assert [name for name, output in found.items() if output == plain[:1]] == []
    return found


def drafted_rows_without(monkeypatch, removed: dict):
    """Plant a bug: every drafted row (each row after a window's first) is drawn with `removed` set on the
    request's settings (a setting turned off) in place of the request's own."""
    real = Engine._draws

    def planted(self, streams, windows, logits, starts, planned=None):
        draws = real(self, streams, windows, logits, starts, planned)
        for s, stream in enumerate(streams):
            if draws[s] is None:
                continue
            request, host = stream.request, self.model.backend.to_host(logits[starts[s]:starts[s + 1]])

            def draw(row, first=draws[s], request=request, host=host):
                if row == 0:
                    return first(row)
                own, request.params = request.params, dataclasses.replace(request.params, **removed)
                try:
                    return self._sample(request, host[row])
                finally:
                    request.params = own
            draws[s] = draw
        return draws
    monkeypatch.setattr(Engine, "_draws", planted)


def test_process_logits_follows_the_formulas():
    """Against the formulas written out, one token at a time: the bias first, then the repetition penalty over the
    prompt and the output (divided when positive, multiplied otherwise), then the presence and frequency penalties
    over the output only."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=50).astype(np.float32) * 3
    prompt, output = [3, 4, 4, 9], [9, 12, 12, 12, 30]
    history = TokenHistory(prompt)
    for token in output:
        history.add(token)
    params = SamplingParams(logit_bias={4: -2.5, 7: 1.0, 30: 100.0}, repetition_penalty=1.7, presence_penalty=0.3,
                            frequency_penalty=0.2)
    expected = logits.copy()
    for token, bias in params.logit_bias.items():
        expected[token] = np.float32(expected[token] + np.float32(bias))
    penalty = np.float32(1.7)
    for token in set(prompt) | set(output):
        expected[token] = expected[token] / penalty if expected[token] > 0 else expected[token] * penalty
    for token in set(output):
        expected[token] -= np.float32(0.3) + np.float32(0.2) * np.float32(output.count(token))
    assert process_logits(logits, params, history).tobytes() == expected.tobytes()
    assert process_logits(logits, SamplingParams(), history) is logits  # nothing to apply: the row as it is


def test_repetition_penalty_divides_only_after_the_bias_made_a_logit_positive():
    """The order matters: a logit of -1 biased by +3 is 2, then divided by the penalty (not 3 * -1 * p)."""
    logits = np.array([-1.0, 0.5, -2.0], np.float32)
    params = SamplingParams(logit_bias={0: 3.0}, repetition_penalty=2.0)
    assert process_logits(logits, params, TokenHistory([0, 2])).tolist() == [1.0, 0.5, -4.0]


@pytest.mark.parametrize("value, field", [
    (0.0, "repetition_penalty"), (-1.0, "repetition_penalty"), (1000.0, "repetition_penalty"),
    ({5: 101}, "logit_bias"), ({5: "x"}, "logit_bias"), ({"5": 1.0}, "logit_bias"), ([5], "logit_bias")])
def test_settings_out_of_range_are_refused(value, field):
    assert field in SamplingParams(**{field: value}).problems()


def test_logit_bias_ids_outside_the_vocabulary_are_refused(model):
    from tensorfold.errors import TensorfoldError
    with pytest.raises(TensorfoldError, match="outside the vocabulary"):
        Engine(model).submit([5, 6], SamplingParams(logit_bias={model.config.vocab_size: 1.0}))


@pytest.mark.parametrize("name, shape", [(name, "chain") for name in
                                         ("logit_bias", "repetition_penalty", "stop_token_ids", "penalties")]
                         + [("all", "chain"), ("all", "tree")])
def test_drafted_equals_undrafted(model, prompts, settings, solo, name, shape):
    drafter = (OracleDrafter if shape == "chain" else OracleTreeDrafter)(prompts[:1], solo[name])
    requests = run(model, prompts[:1], settings[name], drafter)
    assert outputs(requests) == solo[name]
    assert requests[0].stats.accepted > 0  # drafted rows were processed, drawn and accepted


@pytest.mark.parametrize("name, removed", [("logit_bias", dict(logit_bias=None)),
                                           ("repetition_penalty", dict(repetition_penalty=1.0))])
def test_control_drafted_rows_drawn_without_the_setting_are_caught(model, prompts, settings, solo, monkeypatch,
                                                                   name, removed):
    drafted_rows_without(monkeypatch, removed)
    requests = run(model, prompts[:1], settings[name], OracleDrafter(prompts[:1], solo[name]))
    assert outputs(requests) != solo[name]


def test_block_drafter_equals_undrafted(model, prompts, settings):
    """The embedded model's own DFlash drafter, greedy (where it guesses best), with every setting at once."""
    greedy = dict(temperature=0.0)
    undrafted = outputs(run(model, prompts[:1], settings["all"], sampling=greedy, tokens=8, draft=False))
    drafter = make_drafter(os.path.join(DEFAULT_MODEL, "drafter"), model, rows=MAX_DRAFT + 1)
    requests = run(model, prompts[:1], settings["all"], drafter, sampling=greedy, tokens=8)
    assert outputs(requests) == undrafted and requests[0].stats.drafted > 0


def test_concurrent_equals_solo(model, prompts, plain, settings, solo):
    """Plain requests (drawn on the backend, batched) beside processed ones (drawn on the host), in one engine:
    each gives its solo output."""
    bias, penalty = settings["logit_bias"], settings["repetition_penalty"]
    second = run(model, prompts[1:], penalty, draft=False)[0].output
    together = run(model, prompts * 2, [{}, {}, bias, penalty], parallel=4)
    assert outputs(together) == plain + [solo["logit_bias"][0], second]


def test_prompt_logprobs_equal_a_whole_prompt_pass(model, monkeypatch):
    """The prompt's log-probabilities, recorded chunk by chunk (4 rows, with a one-row chunk at the end), equal
    those of one pass over the whole prompt; a prompt the cache holds is run again in full. The control scores each
    row against its own token instead of the next."""
    prompt = model.tokenizer.encode("HAMLET:\nTo be, or not to be, that is")
    assert len(prompt) % 4 == 1
    expected = prompt_log_probabilities(model.logits(prompt), prompt, 0, 3)
    engine = Engine(model, chunk=4, prompt_cache=PromptCache(64 << 20, 4))

    def scored():
        request = engine.submit(prompt, SamplingParams(max_tokens=2, prompt_logprobs=3, stop_ids=()))
        while engine.run_round():
            pass
        return request
    first, again = scored(), scored()
    assert first.prompt_logprobs == again.prompt_logprobs == expected and len(expected) == len(prompt) - 1
    assert again.stats.cached_tokens == 0 and engine.prompt_cache.entries  # stored, not resumed
    monkeypatch.setattr("tensorfold.engine.prompt_log_probabilities", lambda rows, p, start, top: [
        log_probabilities(row, p[start + i], top) for i, row in enumerate(rows) if start + i + 1 < len(p)])
    assert scored().prompt_logprobs != expected
