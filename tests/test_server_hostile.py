"""The reliability reproducers: requests, disconnects and signals that once gave a 500, a hang or a dead engine
thread. Each answers an OpenAI-shaped 4xx naming the problem (or a 200), and the server serves the same tokens
afterwards."""
import json
import logging
import signal
import socket
import threading
import time
import types

import httpx
import pytest
from starlette.testclient import TestClient
from test_server import Running, free_port

import tensorfold
from tensorfold.engine import Engine, SamplingParams
from tensorfold.errors import TensorfoldError
from tensorfold.serve import main as serve_main
from tensorfold.serve import memory, protocol
from tensorfold.serve.app import MAX_BODY_BYTES, Server
from tensorfold.serve.tokens import TokenBytes

GOOD = {"prompt": "ROMEO:", "max_tokens": 6, "temperature": 0}
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def model(tiny_hf):
    return tensorfold.load(tiny_hf, backend="numpy")


@pytest.fixture(scope="module")
def served(model):
    running = Running(Server(Engine(model, parallel=4, context=512), "tiny", max_queue=4))
    running.before = httpx.post(running.url + "/v1/completions", json=GOOD).json()["choices"][0]["token_sha256"]
    yield running
    # the server never needed a restart: the same request gives the same tokens after everything in this file
    after = httpx.post(running.url + "/v1/completions", json=GOOD).json()["choices"][0]["token_sha256"]
    running.stop()
    assert after == running.before


def post(served, route, body=None, content=None, headers=None, timeout=60):
    headers = {"content-type": "application/json", **(headers or {})}
    return httpx.post(served.url + route, content=json.dumps(body).encode() if content is None else content,
                      headers=headers, timeout=timeout)


def refused(reply, status, fragment, param="unset"):
    """The reply is an OpenAI error of `status` whose message names `fragment`."""
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    assert fragment in error["message"], error
    if param != "unset":
        assert error["param"] == param


def user(text="Speak, friend."):
    return [{"role": "user", "content": text}]


# --- seeds and the engine thread ------------------------------------------------------------------------------------

def test_seeds_at_the_ends_of_their_range(served):
    reply = post(served, CHAT, {"messages": user(), "max_tokens": 4, "seed": -1})
    assert reply.status_code == 200
    reply = post(served, "/v1/completions", {"prompt": "ROMEO:", "max_tokens": 4, "n": 2, "seed": 2**64 - 1})
    assert reply.status_code == 200
    second = reply.json()["choices"][1]["token_sha256"]  # choice i draws with seed + i, modulo 2^64: here 0
    alone = post(served, "/v1/completions", {"prompt": "ROMEO:", "max_tokens": 4, "seed": 0}).json()
    assert alone["choices"][0]["token_sha256"] == second
    refused(post(served, "/v1/completions", {**GOOD, "seed": 2**64}), 400, "seed must be", "seed")
    refused(post(served, "/v1/completions", {**GOOD, "seed": -2**63 - 1}), 400, "seed must be", "seed")
    assert post(served, "/v1/completions", GOOD).json()["choices"][0]["token_sha256"] == served.before


def test_a_stream_that_fails_after_its_forward_ends_alone(served, monkeypatch):
    engine = served.server.engine
    after = engine._after

    def failing(stream, window, draw, *rest):
        if stream.request.params.max_tokens == 7:
            raise OverflowError("planted failure")
        after(stream, window, draw, *rest)

    monkeypatch.setattr(engine, "_after", failing)
    results = {}
    threads = [threading.Thread(target=lambda k=k: results.__setitem__(
        k, post(served, "/v1/completions", {**GOOD, "max_tokens": k}))) for k in (6, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[6].json()["choices"][0]["token_sha256"] == served.before
    assert results[7].status_code == 500 and "planted failure" in results[7].json()["error"]["message"]
    assert engine.failure is None and httpx.get(served.url + "/health").status_code == 200


def test_a_dead_engine_is_reported_and_fails_fast(model, monkeypatch):
    engine = Engine(model, parallel=1, context=256)
    running = Running(Server(engine, "tiny"))
    try:
        def broken():
            raise MemoryError("planted failure")

        monkeypatch.setattr(engine, "run_round", broken)
        monkeypatch.setattr(threading, "excepthook", lambda args: None)  # the thread's death is what is tested
        started = time.monotonic()
        first = httpx.post(running.url + "/v1/completions", json=GOOD, timeout=10)
        assert first.status_code == 500 and "planted failure" in first.json()["error"]["message"]
        refused(httpx.post(running.url + "/v1/completions", json=GOOD, timeout=10), 503, "engine has stopped")
        assert httpx.get(running.url + "/health").status_code == 503
        assert time.monotonic() - started < 5
    finally:
        running.stop()


# --- bodies ---------------------------------------------------------------------------------------------------------

DEEP = 100_000

BAD_BODIES = {
    "deeply nested JSON": ("/v1/completions", b'{"prompt": ' + b"[" * DEEP + b"]" * DEEP + b"}", "nests deeper"),
    "nested past the limit": ("/v1/completions", json.dumps({"prompt": "x", "stop": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[
        [[["x"]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}).encode(), "nests deeper"),
    "lone surrogate in a prompt": ("/v1/completions", b'{"prompt": "ROMEO \\ud800"}', "lone surrogate"),
    "lone surrogate in a content": (CHAT, b'{"messages": [{"role": "user", "content": "\\udfff"}]}', "surrogate"),
    "lone surrogate in a model": (CHAT, b'{"model": "\\ud800", "messages": [{"role": "user", "content": "x"}]}',
                                  "surrogate"),
    "lone surrogate in a role": (CHAT, b'{"messages": [{"role": "\\ud800", "content": "x"}]}', "surrogate"),
    "lone surrogate on /tokenize": ("/tokenize", b'{"prompt": "\\ud83c"}', "surrogate"),
}


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_bad_bodies_are_400s(served, case):
    route, content, fragment = BAD_BODIES[case]
    refused(post(served, route, content=content), 400, fragment)


def call(arguments, name="get_weather"):
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_turn(calls):
    return [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 21}'}]


def test_tool_call_arguments_as_a_json_string_or_an_object(served):
    as_string = tool_turn([call('{"city": "Paris", "days": [1, 2]}')])
    as_object = tool_turn([call({"city": "Paris", "days": [1, 2]})])
    tokens = [post(served, "/tokenize", {"messages": m}).json()["tokens"] for m in (as_string, as_object)]
    assert tokens[0] == tokens[1]
    assert post(served, CHAT, {"messages": as_string, "max_tokens": 3}).status_code == 200
    assert post(served, "/tokenize", {"messages": tool_turn([call("")])}).status_code == 200  # no arguments


@pytest.mark.parametrize("calls, fragment", [
    (5, "tool_calls must be a list"),
    ([call({"city": "Paris"}, name=None)], "string name"),
    ([call([1])], "must be a JSON object"),
    ([call("[1]")], "must be a JSON object"),
    ([call("{not json")], "not valid JSON"),
    (["call"], "string name"),
])
def test_malformed_tool_calls_are_400s(served, calls, fragment):
    for route in (CHAT, "/tokenize"):
        refused(post(served, route, {"messages": tool_turn(calls), "max_tokens": 3}), 400, fragment, "messages")


@pytest.mark.parametrize("keyword", ["add_generation_prompt", "tools", "tokenize", "namespace", "raise_exception",
                                     "messages", "self"])
def test_chat_template_kwargs_may_not_set_the_calls_own_keywords(served, keyword):
    body = {"messages": user(), "max_tokens": 3, "chat_template_kwargs": {keyword: 1}}
    refused(post(served, CHAT, body), 400, keyword, "chat_template_kwargs")


def test_template_failures_on_odd_messages_are_400s(served):
    odd = [{"role": "user", "content": [{"type": "text", "text": 5}]}, {"role": "user", "content": [7]}]
    for message in odd:
        reply = post(served, CHAT, {"messages": [message], "max_tokens": 3})
        assert reply.status_code in (200, 400), reply.text


def test_null_means_not_given(served):
    body = {"prompt": "ROMEO:", "max_tokens": 5, "max_completion_tokens": None, "stream": None, "draft": None,
            "stop": None, "n": None, "seed": None, "temperature": None, "stream_options": None, "logprobs": None}
    reply = post(served, "/v1/completions", body, timeout=20)
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] <= 5
    chat = {"messages": user(), "max_tokens": 5, "max_completion_tokens": None, "chat_template_kwargs": None,
            "tools": None, "top_logprobs": None}
    reply = post(served, CHAT, chat, timeout=20)
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] <= 5


def test_a_chat_request_without_max_tokens_gets_the_default(served, monkeypatch):
    monkeypatch.setattr(protocol, "DEFAULT_CHAT_MAX_TOKENS", 3)
    reply = post(served, CHAT, {"messages": user(), "temperature": 0})
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] <= 3


def test_n_beyond_the_queue_is_a_400(served):
    refused(post(served, "/v1/completions", {**GOOD, "n": 5}), 400, "more than the queue holds", "n")


@pytest.mark.parametrize("headers, content", [
    ({"content-type": "text/plain"}, json.dumps(GOOD).encode()),
    ({"content-type": "application/x-www-form-urlencoded"}, b"prompt=x"),
    ({"content-type": "application/json; charset=utf-16"}, json.dumps(GOOD).encode("utf-16")),
    ({}, json.dumps(GOOD).encode("utf-16")),
    ({}, json.dumps(GOOD).encode("utf-32")),
    ({}, b"\xef\xbb\xbf" + json.dumps(GOOD).encode()),
])
def test_only_utf8_json_is_read(served, headers, content):
    refused(post(served, "/v1/completions", content=content, headers=headers), 415, "JSON in UTF-8")
    reply = httpx.post(served.url + "/v1/completions", content=json.dumps(GOOD).encode())  # no content type
    refused(reply, 415, "application/json")
    reply = post(served, "/v1/completions", content=json.dumps(GOOD).encode(),
                 headers={"content-type": "Application/JSON; charset=UTF-8"})
    assert reply.status_code == 200


def test_a_chunked_body_is_refused_as_it_grows(served):
    """The 413 comes once the body passes the limit, while the client is still sending."""
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        piece = b"x" * 65536
        for _ in range(MAX_BODY_BYTES // len(piece) + 4):  # past the limit, and never the body's end
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        sock.settimeout(10)
        assert sock.recv(4096).startswith(b"HTTP/1.1 413")


@pytest.mark.parametrize("cut", [b"content-length: 100\r\n\r\n{\"prompt\"",  # hangs up mid-body
                                 b"transfer-encoding: chunked\r\n\r\n4\r\n{\"pr\r\nzz\r\n"])  # a bad chunk
def test_a_body_cut_short_is_no_traceback(served, caplog, cut):
    with caplog.at_level(logging.ERROR):
        with socket.create_connection(("127.0.0.1", served.port)) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n" + cut)
            time.sleep(0.1)
        time.sleep(0.3)
    assert not [r for r in caplog.records if r.exc_info], caplog.text
    assert httpx.post(served.url + "/v1/completions", json=GOOD).json()["choices"][0]["token_sha256"] == served.before


def test_tokenization_leaves_the_event_loop_free(served):
    prompt = "ROMEO: but soft, what light " * 100_000  # 2.7 MiB
    done = {}
    worker = threading.Thread(target=lambda: done.setdefault("tokenize", post(served, "/tokenize", {"prompt": prompt})))
    worker.start()
    time.sleep(0.3)  # the body is in and being tokenized
    started = time.monotonic()
    assert httpx.get(served.url + "/health").status_code == 200
    health = time.monotonic() - started
    worker.join()
    assert done["tokenize"].status_code == 200 and health < 0.5


def test_models_show_no_host_paths(served, model):
    text = httpx.get(served.url + "/v1/models").text
    assert model.path not in text and json.loads(text)["data"][0]["root"] == "tiny"


# --- disconnects and the drain ------------------------------------------------------------------------------------

def test_a_client_that_hangs_up_before_its_answer_frees_its_lane(served):
    engine = served.server.engine
    body = json.dumps({"prompt": "x", "max_tokens": 500, "temperature": 0, "draft": False}).encode()
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.monotonic() + 5
        while not engine.active and time.monotonic() < deadline:
            time.sleep(0.005)
        assert engine.active
    freed = time.monotonic()
    while engine.active and time.monotonic() < freed + 5:
        time.sleep(0.005)
    assert not engine.active and time.monotonic() - freed < 0.5


def test_requests_cancelled_while_queued_leave_the_queue(model, monkeypatch):
    """A request waiting for a lane whose client hung up (cancelled) no longer counts against --max-queue: the
    lane's own request goes on, and a new request is queued instead of refused with a 429."""
    running = Running(Server(Engine(model, parallel=1, context=512), "tiny", max_queue=2))
    engine = running.server.engine
    try:
        slow_rounds(monkeypatch, model, 0.1)
        long = SamplingParams(max_tokens=200, temperature=0)
        busy = engine.submit([5], long)
        deadline = time.monotonic() + 10
        while not engine.active and time.monotonic() < deadline:
            time.sleep(0.005)
        queued = [engine.submit([5], long) for _ in range(2)]
        assert engine.queue_depth == 2  # the control: waiting requests count until they are cancelled
        for request in queued:
            request.cancel()
        assert engine.queue_depth == 0 and busy.finish_reason is None
        with httpx.stream("POST", running.url + "/v1/completions", json={**GOOD, "n": 2, "stream": True},
                          timeout=10) as reply:
            assert reply.status_code == 200  # queued behind the lane, not refused
    finally:
        running.stop()


def slow_rounds(monkeypatch, model, seconds):
    forward = model.net.forward_logits

    def slow(windows, taps=()):
        time.sleep(seconds)
        return forward(windows, taps=taps)

    monkeypatch.setattr(model.net, "forward_logits", slow)


def test_keep_alive_comments_and_no_cache_on_streams(served, model, monkeypatch):
    slow_rounds(monkeypatch, model, 0.2)
    monkeypatch.setattr(served.server, "keepalive", 0.01)
    with httpx.stream("POST", served.url + "/v1/completions", json={**GOOD, "max_tokens": 2, "stream": True},
                      timeout=30) as reply:
        assert reply.headers["cache-control"] == "no-cache"
        lines = list(reply.iter_lines())
    assert ": keep-alive" in lines and [line for line in lines if line][-1] == "data: [DONE]"


def read_stream(url, body, lines):
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=30) as reply:
        lines.extend(line for line in reply.iter_lines() if line)


def test_sigterm_drains_within_its_grace(model, monkeypatch):
    server = Server(Engine(model, parallel=2, context=512), "tiny")
    port = free_port()
    http = serve_main.uvicorn_server(server, "127.0.0.1", port, grace=0.6)
    thread = threading.Thread(target=http.run, daemon=True)
    thread.start()
    while not http.started:
        time.sleep(0.01)
    url = f"http://127.0.0.1:{port}"
    slow_rounds(monkeypatch, model, 0.01)
    short, long = [], []
    streams = [threading.Thread(target=read_stream, args=(url, {**GOOD, "max_tokens": k, "draft": False}, lines))
               for k, lines in ((8, short), (480, long))]
    for t in streams:
        t.start()
    while not long:
        time.sleep(0.01)
    http.handle_exit(signal.SIGTERM, None)
    time.sleep(0.05)
    refused(httpx.post(url + "/v1/completions", json=GOOD), 503, "shutting down")
    assert httpx.get(url + "/health").status_code == 503
    for t in streams:
        t.join(timeout=10)
    thread.join(timeout=10)
    assert not thread.is_alive()
    for lines in (short, long):
        assert lines[-1] == "data: [DONE]"
        assert json.loads(lines[-2][len("data: "):])["choices"][0]["finish_reason"] in ("length", "stop")
    assert len(long) < 480  # cut at the grace


# --- start-up, CORS, keys, memory, logprobs' bytes ------------------------------------------------------------------

def test_an_empty_api_key_is_refused_at_start(model, monkeypatch, capsys):
    assert serve_main.main(["--api-key", ""]) == 2
    assert "API key" in capsys.readouterr().err
    monkeypatch.setenv("TENSORFOLD_API_KEY", "")
    assert serve_main.main([]) == 2
    with pytest.raises(TensorfoldError, match="API key is empty"):
        Server(Engine(model, parallel=1, context=64), "tiny", api_key="")


def test_cors_only_for_the_origins_allowed(model):
    engine = Engine(model, parallel=1, context=64)
    preflight = {"origin": "https://app.example", "access-control-request-method": "POST",
                 "access-control-request-headers": "authorization, content-type"}
    allowed = TestClient(Server(engine, "tiny", allowed_origins=["https://app.example"]).app())
    reply = allowed.options("/v1/chat/completions", headers=preflight)
    assert reply.status_code == 200 and reply.headers["access-control-allow-origin"] == "https://app.example"
    other = allowed.options("/v1/chat/completions", headers={**preflight, "origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers
    closed = TestClient(Server(engine, "tiny").app())
    assert closed.options("/v1/chat/completions", headers=preflight).status_code == 405


def test_api_key_compared_as_bytes(model):
    client = TestClient(Server(Engine(model, parallel=1, context=64), "tiny", api_key="clé").app())
    assert client.get("/v1/models", headers={"authorization": "Bearer clé".encode()}).status_code == 200
    for wrong in ("Bearer cle", "Bearer clé ", "clé", ""):
        assert client.get("/v1/models", headers={"authorization": wrong.encode()}).status_code == 401


def test_flags_for_logging_and_origins():
    args = serve_main.parser().parse_args(["--log-level", "debug", "--access-log", "--allowed-origins", "a, b"])
    assert (args.log_level, args.access_log, args.allowed_origins) == ("debug", True, "a, b")
    defaults = serve_main.parser().parse_args([])
    assert (defaults.log_level, defaults.access_log, defaults.allowed_origins, defaults.shutdown_grace) == \
        ("info", False, "", 30.0)


def test_the_host_memory_plan_reads_mem_available(tmp_path, monkeypatch):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  1000 kB\nMemFree:  10 kB\nMemAvailable:  600 kB\n")
    assert memory.available_host_bytes(str(meminfo)) == 600 * 1024
    assert memory.available_host_bytes(str(tmp_path / "none")) > 0  # no /proc: the free pages
    monkeypatch.setattr(memory, "SIMULATED", False)
    assert memory.on_gpu(types.SimpleNamespace(on_device=True, can_record=False))
    assert not memory.on_gpu(types.SimpleNamespace(on_device=False, can_record=True))


def test_logprobs_bytes_are_the_tokens_own(served, model):
    text = "日本🎭 ROMEO"
    ids = model.tokenizer.encode(text)
    token_bytes = TokenBytes(model.tokenizer)
    assert any("\ufffd" in model.tokenizer.decode([i]) for i in ids)  # tokens that hold part of a character
    assert b"".join(bytes(token_bytes(i)) for i in ids) == text.encode()
    reply = post(served, CHAT, {"messages": user(), "max_tokens": 6, "logprobs": True, "top_logprobs": 2}).json()
    for entry in reply["choices"][0]["logprobs"]["content"]:
        assert entry["bytes"] == list(entry["token"].encode()) or "\ufffd" in entry["token"]
