"""Hostile input: random bodies on every route never produce a 5xx and never take the server down; SIGTERM drains
and exits cleanly."""
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_server import Running, free_port

import tensorfold
from tensorfold.engine import Engine
from tensorfold.serve.app import Server

ROUTES = ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"]
FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
          "min_p", "seed", "stop", "n", "stream", "stream_options", "logprobs", "top_logprobs", "presence_penalty",
          "frequency_penalty", "chat_template_kwargs", "tools", "draft", "tokens", "logit_bias"]
TEMPLATE_KEYWORDS = ["add_generation_prompt", "tools", "tokenize", "namespace", "raise_exception", "enable_thinking"]
texts = st.text(max_size=20) | st.sampled_from(["\ud800", "a\udfffb", "日本🎭", "<|im_end|>", "{{ 7 }}"])
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True), texts)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(texts, inner, max_size=4)),
                      max_leaves=10)
arguments = st.one_of(values, st.dictionaries(texts, values, max_size=3),
                      st.dictionaries(texts, values, max_size=3).map(json.dumps), texts)
tool_call = st.fixed_dictionaries({"function": st.fixed_dictionaries({"name": st.one_of(texts, values),
                                                                      "arguments": arguments})},
                                  optional={"id": texts, "type": texts})
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "x"]) | texts,
                                 "content": st.one_of(texts, values)},
                                optional={"tool_calls": st.one_of(st.lists(tool_call, max_size=2), values)})
bodies = st.one_of(
    st.dictionaries(st.sampled_from(FIELDS), values, max_size=6),
    st.fixed_dictionaries({"prompt": st.one_of(st.text(min_size=1, max_size=30),
                                               st.lists(st.integers(-5, 600), min_size=1, max_size=8))},
                          optional={k: values for k in FIELDS if k != "prompt"}),
    st.fixed_dictionaries({"messages": st.lists(message, min_size=1, max_size=3)},
                          optional={**{k: values for k in FIELDS if k != "messages"},
                                    "chat_template_kwargs": st.dictionaries(st.sampled_from(TEMPLATE_KEYWORDS), values,
                                                                            max_size=2)}))
CONTENT_TYPES = ["application/json", "application/json", "application/json", "application/json; charset=utf-8",
                 "text/plain", "application/json; charset=utf-16", None]
GOOD = {"prompt": "ROMEO:", "max_tokens": 6, "temperature": 0}


def good_tokens(running) -> str:
    return httpx.post(running.url + "/v1/completions", json=GOOD).json()["choices"][0]["token_sha256"]


@pytest.fixture(scope="module")
def served(tiny_hf):
    model = tensorfold.load(tiny_hf, backend="numpy")
    running = Running(Server(Engine(model, parallel=4, context=512), "tiny"))
    running.before = good_tokens(running)
    yield running
    running.stop()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(ROUTES), body=bodies, raw=st.booleans(), media=st.sampled_from(CONTENT_TYPES),
       encoding=st.sampled_from(["utf-8"] * 6 + ["utf-16"]))
def test_random_bodies_never_5xx(served, route, body, raw, media, encoding):
    for name, cap in (("max_tokens", 8), ("max_completion_tokens", 8), ("n", 2)):  # keep generation short
        if isinstance(body.get(name), int) and not isinstance(body[name], bool):
            body[name] = min(abs(body[name]), cap)
    if not any(isinstance(body.get(n), int) for n in ("max_tokens", "max_completion_tokens")):
        body["max_tokens"] = 4
    text = json.dumps(body) if not raw else json.dumps(body)[:-1]  # raw: cut JSON
    reply = httpx.post(served.url + route, content=text.encode(encoding),
                       headers={"content-type": media} if media else {}, timeout=60)
    assert reply.status_code in (200, 400, 404, 413, 415), (route, body, reply.text)
    if reply.status_code >= 400:
        assert set(reply.json()["error"]) == {"message", "type", "param", "code"}
    assert httpx.get(served.url + "/health").status_code == 200


def test_after_the_fuzz_a_good_request_gives_the_same_tokens(served):
    assert good_tokens(served) == served.before


def test_sigterm_drains_and_exits(tiny_hf):
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", "import sys; from tensorfold.cli.main import serve_main; "
                               "sys.exit(serve_main(sys.argv[1:]))", "--model", tiny_hf, "--port", str(port),
                               "--backend", "numpy", "--context", "512", "--shutdown-grace", "1"],
                              stderr=subprocess.PIPE, text=True, env={**os.environ})
    try:
        url = f"http://127.0.0.1:{port}"
        deadline, up = time.time() + 120, False
        while time.time() < deadline and not up and server.poll() is None:
            try:
                up = httpx.get(url + "/health").status_code == 200
            except httpx.TransportError:
                time.sleep(0.2)
        if not up:  # stopped first, so that its log can be read to its end
            server.kill()
            status = server.wait()
            pytest.fail(f"the server never answered /health (exit status {status}): {server.stderr.read()[-2000:]}")
        assert httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 4}).status_code == 200
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
        log = server.stderr.read()
        assert "serving  " in log and "draining" in log and "stopped  after 1 requests" in log
        assert "Traceback" not in log and "CancelledError" not in log
    finally:
        if server.poll() is None:
            server.kill()
