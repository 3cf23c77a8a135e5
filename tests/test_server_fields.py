"""A conformance run of the request fields through the official `openai` client: each field the server reads does
what docs/serving.rst says, on both routes where it applies, streamed and not, and each field it does not read is
refused with a 400 that names it.

A field's effect is checked against the engine run directly with the same settings (the token ids' sha256), and
against the same request without the field (it must differ), so that a field passed through but ignored fails."""
import dataclasses

import httpx
import openai
import pytest
from test_server import Running

import tensorfold
from tensorfold.drafters import NgramDrafter
from tensorfold.engine import Engine
from tensorfold.models import DEFAULT_MODEL
from tensorfold.sampling import SamplingParams
from tensorfold.serve import protocol
from tensorfold.serve.app import Server, token_sha256

PROMPT = "ROMEO:\n"
MESSAGES = [{"role": "user", "content": "Speak, friend."}]
SAMPLED = dict(temperature=0.8, seed=5)
ROUTES = [("chat", False), ("chat", True), ("completions", False), ("completions", True)]


@dataclasses.dataclass
class Answer:
    text: str
    sha: str
    finish: str
    tokens: list  # (completions, with logprobs) the logprobs' tokens
    token_logprobs: list


@pytest.fixture(scope="module")
def model():
    return tensorfold.load(DEFAULT_MODEL, backend="numpy")


@pytest.fixture(scope="module")
def served(model):
    running = Running(Server(Engine(model, parallel=4, context=512, drafter=NgramDrafter()), "tiny"))
    yield running
    running.stop()


def ask(served, route, stream, messages=MESSAGES, prompt=PROMPT, **fields) -> Answer:
    """One request through the openai client, read the same way whether it streamed or not."""
    client = served.client()
    if route == "chat":
        reply = client.chat.completions.create(model="tiny", messages=messages, stream=stream, **fields)
    else:
        reply = client.completions.create(model="tiny", prompt=prompt, stream=stream, **fields)
    choices = [reply.choices[0]] if not stream else [c for chunk in reply for c in chunk.choices]
    text, tokens, token_logprobs = "", [], []
    for c in choices:
        text += (c.message.content if not stream else c.delta.content or "") if route == "chat" else c.text
        if route == "completions" and c.logprobs is not None:
            tokens += c.logprobs.tokens
            token_logprobs += c.logprobs.token_logprobs
    return Answer(text, choices[-1].model_extra["token_sha256"], choices[-1].finish_reason, tokens, token_logprobs)


def prompt_ids(model, route, messages=MESSAGES, **template):
    if route == "chat":
        return model.tokenizer.apply_chat_template(messages, tokenize=True, **template)
    return model.tokenizer.encode(PROMPT)


def engine_sha(model, ids, max_tokens, **settings) -> str:
    """The sha256 of what the engine itself generates with these settings, undrafted."""
    engine = Engine(model, parallel=1, context=512)
    return token_sha256(engine.generate(ids, SamplingParams(max_tokens=max_tokens, draft=False, **settings)))


def post(served, route, body) -> httpx.Response:
    """A raw POST of `body` (over a short default request) to a route."""
    path = "/v1/chat/completions" if route == "chat" else "/v1/completions"
    base = {"messages": MESSAGES} if route == "chat" else {"prompt": PROMPT}
    return httpx.post(served.url + path, json={**base, "max_tokens": 2, **body})


@pytest.mark.parametrize("route, stream", ROUTES)
def test_logit_bias_forces_and_bans_tokens(served, model, route, stream):
    forced = model.tokenizer.encode(" the")[0]
    answer = ask(served, route, stream, max_tokens=5, logit_bias={str(forced): 100}, **SAMPLED)
    assert answer.sha == token_sha256([forced] * 5)
    plain = ask(served, route, stream, max_tokens=5, temperature=0)
    first = model.tokenizer.encode(plain.text)[0]
    banned = ask(served, route, stream, max_tokens=5, temperature=0, logit_bias={str(first): -100})
    assert banned.sha == engine_sha(model, prompt_ids(model, route), 5, logit_bias={first: -100})
    assert banned.sha != plain.sha


@pytest.mark.parametrize("route, stream", ROUTES)
def test_repetition_penalty(served, model, route, stream):
    answer = ask(served, route, stream, max_tokens=10, extra_body={"repetition_penalty": 1.5}, **SAMPLED)
    assert answer.sha == engine_sha(model, prompt_ids(model, route), 10, repetition_penalty=1.5, **SAMPLED)
    assert answer.sha != ask(served, route, stream, max_tokens=10, **SAMPLED).sha
    undrafted = ask(served, route, stream, max_tokens=10, extra_body={"repetition_penalty": 1.5, "draft": False},
                    **SAMPLED)
    assert undrafted.sha == answer.sha


@pytest.mark.parametrize("route, stream", ROUTES)
def test_stop_token_ids(served, model, route, stream):
    ids = prompt_ids(model, route)
    plain = Engine(model, parallel=1, context=512).generate(ids, SamplingParams(max_tokens=12, draft=False))
    stop = plain[5]
    answer = ask(served, route, stream, max_tokens=12, temperature=0, extra_body={"stop_token_ids": [stop]})
    assert answer.sha == token_sha256(plain[:plain.index(stop)]) and answer.finish == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_echo(served, model, stream):
    answer = ask(served, "completions", stream, max_tokens=6, temperature=0, echo=True)
    plain = ask(served, "completions", stream, max_tokens=6, temperature=0)
    assert answer.text == PROMPT + plain.text and answer.sha == plain.sha
    ids = model.tokenizer.encode(PROMPT)
    scored = ask(served, "completions", stream, max_tokens=6, temperature=0, echo=True, logprobs=2)
    assert scored.tokens[:len(ids)] == [model.tokenizer.decode([t]) for t in ids]
    assert scored.token_logprobs[0] is None and all(lp <= 0 for lp in scored.token_logprobs[1:])
    assert len(scored.tokens) == len(ids) + 6
    by_ids = ask(served, "completions", stream, prompt=ids, max_tokens=6, temperature=0, echo=True)
    assert by_ids.text == model.tokenizer.decode(ids) + plain.text


@pytest.mark.parametrize("stream", [False, True])
def test_continue_final_message_and_add_generation_prompt(served, model, stream):
    messages = MESSAGES + [{"role": "assistant", "content": "Good morrow, my"}]
    template = dict(add_generation_prompt=False, continue_final_message=True)
    answer = ask(served, "chat", stream, messages=messages, max_tokens=8, temperature=0, extra_body=template)
    ids = prompt_ids(model, "chat", messages, **template)
    text = model.tokenizer.decode(ids)
    assert text.endswith("Good morrow, my") and text.count("<|im_start|>assistant") == 1  # left open
    assert answer.sha == engine_sha(model, ids, 8)
    tokenized = httpx.post(served.url + "/tokenize", json={"messages": messages, **template}).json()["tokens"]
    assert tokenized == ids
    closed = ask(served, "chat", stream, messages=messages, max_tokens=8, temperature=0,
                 extra_body={"add_generation_prompt": False})
    assert closed.sha == engine_sha(model, prompt_ids(model, "chat", messages, add_generation_prompt=False), 8)
    assert len({answer.sha, closed.sha, ask(served, "chat", stream, messages=messages, max_tokens=8,
                                            temperature=0).sha}) == 3


@pytest.mark.parametrize("stream", [False, True])
def test_best_of_equal_to_n(served, stream):
    reply = served.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=3, n=2, best_of=2,
                                               stream=stream, **SAMPLED)
    indices = {c.index for c in reply.choices} if not stream else {c.index for chunk in reply for c in chunk.choices}
    assert indices == {0, 1}


@pytest.mark.parametrize("route, body, param, message", [
    ("completions", {"suffix": "end"}, "suffix", "suffix is not supported"),
    ("completions", {"best_of": 2}, "best_of", "best_of must equal n"),
    ("completions", {"metadata": {"a": "b"}}, "metadata", "Unrecognized request argument"),
    ("chat", {"echo": True}, "echo", "Unrecognized request argument"),
    ("chat", {"suffix": "x"}, "suffix", "Unrecognized request argument"),
    ("chat", {"add_generation_prompt": True, "continue_final_message": True}, "continue_final_message", "both"),
    ("chat", {"continue_final_message": True, "add_generation_prompt": False,
              "messages": [{"role": "user", "content": ""}]}, "continue_final_message", "text to continue"),
    ("chat", {"parallel_tool_calls": False}, "parallel_tool_calls", "supported only with tool_choice"),
    ("chat", {"parallel_tool_calls": 1}, "parallel_tool_calls", "true or false"),
    ("chat", {"logprobs": 1}, "logprobs", "true or false"),
    ("completions", {"stream_options": False}, "stream_options", "must be an object"),
    ("chat", {"stream_options": []}, "stream_options", "must be an object"),
    ("chat", {"add_generation_prompt": "yes"}, "add_generation_prompt", "true or false"),
    ("completions", {"echo": 1}, "echo", "true or false"),
    ("completions", {"logit_bias": {"99999": 1}}, "logit_bias", "outside the vocabulary"),
    ("completions", {"logit_bias": {"5": 101}}, "logit_bias", "-100 to 100"),
    ("completions", {"logit_bias": {"the": 1}}, "logit_bias", "not a token id"),
    ("completions", {"logit_bias": [5]}, "logit_bias", "object"),
    ("chat", {"repetition_penalty": 0}, "repetition_penalty", "repetition_penalty must be"),
    ("chat", {"repetition_penalty": -1.2}, "repetition_penalty", "repetition_penalty must be"),
    ("completions", {"stop_token_ids": [99999]}, "stop_token_ids", "outside the vocabulary"),
    ("completions", {"stop_token_ids": 5}, "stop_token_ids", "list of token ids"),
    ("chat", {"stream": True, "stream_options": {"continuous_usage_stats": True}}, "stream_options",
     "continuous_usage_stats"),
    ("chat", {"user": 5}, "user", "string"),
])
def test_refused_fields_are_400s_that_name_them(served, route, body, param, message):
    reply = post(served, route, body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and message in error["message"] and error["type"] == "BadRequestError"


def test_the_openai_client_raises_on_refused_fields(served):
    client = served.client()
    with pytest.raises(openai.BadRequestError, match="suffix"):
        client.completions.create(model="tiny", prompt=PROMPT, suffix="the end")
    with pytest.raises(openai.BadRequestError, match="store"):
        client.chat.completions.create(model="tiny", messages=MESSAGES, store=True)


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_null_is_not_given_for_every_field(served, route):
    """Clients send null for fields they leave unset: null answers as if the field were absent, known or not."""
    nulls = {name: None for name in protocol.FIELDS[route] if name not in ("messages", "prompt")}
    base = post(served, route, {"temperature": 0, "max_tokens": 4})
    assert base.status_code == 200
    given = post(served, route, {**nulls, "temperature": 0, "max_tokens": 4, "suffix": None, "metadata": None,
                                 "user": "someone"})
    assert given.status_code == 200, given.text
    assert given.json()["choices"][0]["token_sha256"] == base.json()["choices"][0]["token_sha256"]


def test_every_accepted_field_is_documented():
    """docs/serving.rst names every field each route reads, and every field it refuses."""
    from pathlib import Path
    text = (Path(__file__).resolve().parents[1] / "docs" / "serving.rst").read_text()
    fields = set().union(*protocol.FIELDS.values(), *protocol.REFUSED.values())
    assert sorted(name for name in fields if f"``{name}``" not in text) == []
