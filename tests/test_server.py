"""tensorfold-serve end to end: a real uvicorn server on loopback, driven by the official `openai` client and by
raw HTTP for malformed input."""
import concurrent.futures
import socket
import threading
import time

import httpx
import openai
import pytest
import uvicorn

import tensorfold
from tensorfold.drafters import NgramDrafter
from tensorfold.engine import Engine
from tensorfold.models import DEFAULT_MODEL
from tensorfold.prompt_cache import PromptCache
from tensorfold.serve.app import Server, token_sha256


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Running:
    """A Server under uvicorn on a background thread."""

    def __init__(self, server: Server):
        self.server, self.port = server, free_port()
        self.uvicorn = uvicorn.Server(uvicorn.Config(server.app(), host="127.0.0.1", port=self.port,
                                                     log_level="warning"))
        self.thread = threading.Thread(target=self.uvicorn.run, daemon=True)
        self.thread.start()
        while not self.uvicorn.started:
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0, **kw)

    def stop(self):
        self.uvicorn.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def tiny_model(tiny_hf):
    return tensorfold.load(tiny_hf, backend="numpy")


@pytest.fixture(scope="module")
def served(tiny_model):
    engine = Engine(tiny_model, parallel=16, context=1024, drafter=NgramDrafter(), chunk=32,
                    prompt_cache=PromptCache(64 << 20, 32, spacing=64))
    running = Running(Server(engine, "tiny"))
    yield running
    running.stop()


def test_models_and_health(served):
    client = served.client()
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert httpx.get(served.url + "/health").json() == {"status": "ok"}


def test_chat_sync_and_stream_agree(served, tiny_model):
    client = served.client()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who goes there?"}]
    reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and reply.usage.completion_tokens <= 12
    assert reply.usage.prompt_tokens_details.cached_tokens == 0
    prompt = tiny_model.tokenizer.apply_chat_template(messages, tokenize=True)
    expected = tiny_model.generate(prompt, 12)
    assert choice.model_extra["token_sha256"] == token_sha256(expected)
    pieces, finish = [], None
    for chunk in client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0,
                                                stream=True):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert "".join(pieces) == choice.message.content and finish == choice.finish_reason


def test_completions_sync_stream_and_usage(served, tiny_model):
    client = served.client()
    reply = client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=10, temperature=0.8, seed=3)
    expected = tiny_model.generate(tiny_model.tokenizer.encode("ROMEO:"), 10, temperature=0.8, seed=3)
    assert reply.choices[0].model_extra["token_sha256"] == token_sha256(expected)
    chunks = list(client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=10, temperature=0.8, seed=3,
                                            stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(expected)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == reply.choices[0].text
    draft_off = client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=10, temperature=0.8, seed=3,
                                          extra_body={"draft": False})
    assert draft_off.choices[0].model_extra["token_sha256"] == reply.choices[0].model_extra["token_sha256"]


def test_a_negative_seed_draws_as_its_value_modulo_2_to_the_64(served, tiny_model):
    """OpenAI's seed is a signed integer; every path reads it modulo 2^64. The control is the seed next to it."""
    def ask(seed):
        return served.client().completions.create(model="tiny", prompt="ROMEO:", max_tokens=8, temperature=1.0,
                                                  seed=seed, n=2).choices

    prompt = tiny_model.tokenizer.encode("ROMEO:")
    choices = ask(-5)
    for index, seed in enumerate((2**64 - 5, 2**64 - 4)):  # choice n draws with the seed plus n
        expected = token_sha256(tiny_model.generate(prompt, 8, temperature=1.0, seed=seed))
        assert choices[index].model_extra["token_sha256"] == expected
    assert ask(-4)[0].model_extra["token_sha256"] != choices[0].model_extra["token_sha256"]


def test_stop_strings_and_n(served):
    client = served.client()
    full = client.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=20, temperature=0).choices[0].text
    stop = full[3:6]
    assert stop and full.find(stop) == 3
    cut = client.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=20, temperature=0, stop=[stop])
    assert cut.choices[0].text == full[:3] and cut.choices[0].finish_reason == "stop"
    again = client.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=20, temperature=0, stop=[stop])
    assert again.choices[0].model_extra["token_sha256"] == cut.choices[0].model_extra["token_sha256"]
    assert cut.usage.completion_tokens < 20  # counted up to the token that completed the stop string
    several = client.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=6, temperature=1.0, seed=1, n=3)
    assert [c.index for c in several.choices] == [0, 1, 2]


def test_sixteen_concurrent_clients_equal_their_solo_runs(served):
    client = served.client()
    prompts = [[3 + i, 40 + 2 * i, 7] for i in range(16)]
    ask = lambda p: client.completions.create(model="tiny", prompt=p, max_tokens=12, temperature=0.9,  # noqa: E731
                                              seed=7).choices[0].model_extra["token_sha256"]
    solo = [ask(p) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        together = list(pool.map(ask, prompts))
    assert together == solo


@pytest.mark.parametrize("body, status, message", [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (b'{"model": "other", "prompt": "x"}', 404, "does not exist"),
    (b'{"prompt": "x", "temperature": -1}', 400, "temperature"),
    (b'{"prompt": "x", "max_tokens": "ten"}', 400, "max_tokens"),
    (b'{"prompt": "x", "n": 99}', 400, "n must be"),
    (b'{"prompt": ""}', 400, "prompt"),
    (b'{"prompt": [1, 99999999]}', 400, "outside the vocabulary"),
    (b'{"prompt": "x", "max_tokens": 5000}', 400, "maximum context length is 1024 tokens"),
    (b'{"prompt": "x", "logit_bias": {"5": 101}}', 400, "-100 to 100"),
    (b'{"prompt": "x", "suffix": "y"}', 400, "suffix is not supported"),
    (b'{"prompt": "x", "frobnicate": 1}', 400, "Unrecognized request argument supplied: frobnicate"),
    (b'{"prompt": "x", "logprobs": 99}', 400, "logprobs"),
    (b'{"prompt": "x", "presence_penalty": 3}', 400, "presence_penalty"),
    (b'{"prompt": "x", "stop": [3]}', 400, "stop"),
    (b'{"prompt": "x", "stop": ""}', 400, "non-empty string"),
])
def test_bad_completions_get_400s_in_openai_shape(served, body, status, message):
    reply = httpx.post(served.url + "/v1/completions", content=body, headers={"content-type": "application/json"})
    assert reply.status_code == status
    error = reply.json()["error"]
    assert message in error["message"] and error["code"] == status


def test_oversized_body_is_413(served):
    reply = httpx.post(served.url + "/v1/completions", content=b'{"prompt": "' + b"x" * (5 << 20) + b'"}',
                       headers={"content-type": "application/json"})
    assert reply.status_code == 413 and "larger than" in reply.json()["error"]["message"]


def test_bad_chat_requests(served):
    post = lambda body: httpx.post(served.url + "/v1/chat/completions", json=body)  # noqa: E731
    assert post({"messages": []}).status_code == 400
    assert post({"messages": [{"content": "no role"}]}).status_code == 400
    late_system = [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]
    assert "chat template" in post({"messages": late_system}).json()["error"]["message"]
    assert httpx.get(served.url + "/v1/chat/completions").status_code == 405


def test_tokenize_detokenize_and_metrics(served, tiny_model):
    ids = httpx.post(served.url + "/tokenize", json={"prompt": "ROMEO: hi"}).json()["tokens"]
    assert ids == tiny_model.tokenizer.encode("ROMEO: hi")
    assert httpx.post(served.url + "/detokenize", json={"tokens": ids}).json()["prompt"] == "ROMEO: hi"
    metrics = httpx.get(served.url + "/metrics").text
    for name in ("tensorfold_requests_total", "tensorfold_rounds_total", "tensorfold_queue_depth",
                 "tensorfold_accepted_rows_total", "tensorfold_request_seconds_bucket"):
        assert name in metrics


def test_disconnect_frees_the_lane(served):
    with httpx.stream("POST", served.url + "/v1/completions",
                      json={"prompt": "x", "max_tokens": 900, "stream": True, "temperature": 0}) as reply:
        for line in reply.iter_lines():
            if line.startswith("data:"):
                break  # hang up after the first token
    deadline = time.time() + 10
    while served.server.engine.active and time.time() < deadline:
        time.sleep(0.05)
    assert not served.server.engine.active


def test_api_key_and_full_queue(tiny_model, monkeypatch):
    running = Running(Server(Engine(tiny_model, parallel=1, context=256), "tiny", api_key="sesame", max_queue=2))
    try:
        assert httpx.post(running.url + "/v1/completions", json={"prompt": "x"}).status_code == 401
        with pytest.raises(openai.AuthenticationError):
            running.client(api_key="wrong").completions.create(model="tiny", prompt="x")
        monkeypatch.setattr(Engine, "queue_depth", property(lambda engine: 2))  # a queue already full
        reply = httpx.post(running.url + "/v1/completions", json={"prompt": "x"},
                           headers={"authorization": "Bearer sesame"})
        assert reply.status_code == 429 and reply.headers["retry-after"] == "1"
        assert httpx.get(running.url + "/health").status_code == 200  # health stays open
    finally:
        running.stop()


def test_default_model_chat_is_shakespeare():
    model = tensorfold.load(DEFAULT_MODEL, backend="numpy")
    running = Running(Server(Engine(model, parallel=2, context=512), "tiny-shakespeare"))
    try:
        started = time.time()
        reply = running.client().chat.completions.create(
            model="tiny-shakespeare", messages=[{"role": "user", "content": "Speak, friend."}], max_tokens=40,
            temperature=0.7, seed=2)
        elapsed = time.time() - started
        text = reply.choices[0].message.content
        assert reply.usage.completion_tokens >= 20 and elapsed < 60
        words = [w.strip(".,;:!?'") for w in text.split()]
        english = {"the", "and", "i", "to", "of", "my", "you", "a", "that", "is", "in", "not", "me", "it", "thou",
                   "thy", "with", "be", "your", "his", "this", "for", "but", "have", "so", "he", "will", "what"}
        assert sum(w.lower() in english for w in words) >= 3, text
    finally:
        running.stop()


def test_logprobs_and_penalties(served, tiny_model):
    client = served.client()
    reply = client.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=6, temperature=0, logprobs=3)
    lp = reply.choices[0].logprobs
    assert len(lp.token_logprobs) == 6 and all(1 <= len(top) <= 3 for top in lp.top_logprobs)  # keyed by text
    assert all(v <= 0 for v in lp.token_logprobs)
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                          temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and content[0].top_logprobs[0].logprob >= content[0].top_logprobs[1].logprob
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], top_logprobs=2)
    penalised = client.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=24, temperature=0,
                                          frequency_penalty=2.0, presence_penalty=2.0)
    drafted = client.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=24, temperature=0,
                                        frequency_penalty=2.0, presence_penalty=2.0, extra_body={"draft": False})
    assert drafted.choices[0].model_extra["token_sha256"] == penalised.choices[0].model_extra["token_sha256"]


def test_resumed_prompt_equals_fresh(served, tiny_model):
    client = served.client()
    prompt = list(range(10, 150))
    ask = lambda p: client.completions.create(model="tiny", prompt=p, max_tokens=8, temperature=0.8, seed=9)  # noqa
    first, again = ask(prompt), ask(prompt)
    extended = ask(prompt + [7, 8, 9])
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == 128  # the last 32-row chunk boundary before 140
    assert extended.usage.prompt_tokens_details.cached_tokens == 128
    fresh = tiny_model.generate(prompt, 8, temperature=0.8, seed=9)
    assert first.choices[0].model_extra["token_sha256"] == again.choices[0].model_extra["token_sha256"] \
        == token_sha256(fresh)
    assert extended.choices[0].model_extra["token_sha256"] == token_sha256(
        tiny_model.generate(prompt + [7, 8, 9], 8, temperature=0.8, seed=9))
    assert "tensorfold_prompt_cache_hits_total" in httpx.get(served.url + "/metrics").text


def test_prompt_cache_evicts_least_recently_used(tiny_model):
    state = tiny_model.net.new_state()
    tiny_model.net.forward(list(range(1, 33)), state)
    cache = PromptCache(1, 32)
    cache.store(list(range(1, 33)), state)
    assert not cache.entries  # larger than the whole budget: not kept
    from tensorfold.prompt_cache import Snapshot
    one = Snapshot(state).nbytes
    cache = PromptCache(2 * one, 32)
    for first in (1, 2, 3):
        s = tiny_model.net.new_state()
        tiny_model.net.forward(list(range(first, first + 32)), s)
        cache.store(list(range(first, first + 32)), s)
    assert len(cache.entries) == 2 and cache.lookup(list(range(1, 40))) is None  # the oldest went first
    assert cache.lookup(list(range(3, 40))).length == 32


@pytest.mark.parametrize("control", [False, True])
def test_a_prompt_chunk_ends_at_each_mark_of_the_prompt_cache(tiny_model, monkeypatch, control):
    """The prompt cache marks every 4 rows (the last mark of a 23-token prompt: 20) and the engine runs 16-row
    chunks: the engine ends a chunk at the mark (0-16, 16-20, 20-23), the cache stores the stream there, and the
    same prompt again resumes at 20 with the fresh output. Control: an engine that does not end its chunks at marks
    (0-16, 16-23) never reaches 20, so nothing is stored and the prompt runs whole again."""
    from tensorfold.engine import SamplingParams
    if control:
        window = Engine._window

        def window_without_marks(self, stream, drafting=True):
            cache, self.prompt_cache = self.prompt_cache, None
            try:
                return window(self, stream, drafting)
            finally:
                self.prompt_cache = cache
        monkeypatch.setattr(Engine, "_window", window_without_marks)
    prompt, params = list(range(3, 26)), SamplingParams(max_tokens=5, temperature=0.8, seed=4)
    fresh = Engine(tiny_model, chunk=16).generate(prompt, params)
    engine = Engine(tiny_model, chunk=16, prompt_cache=PromptCache(64 << 20, 4))
    first = engine.submit(prompt, params)
    while engine.run_round():
        pass
    again = engine.submit(prompt, params)
    while engine.run_round():
        pass
    assert first.output == again.output == fresh
    # three prompt rounds (two without marks) and four decode rounds; the prompt again from its mark, or whole
    assert (first.stats.rounds, again.stats.cached_tokens) == ((2 + 4, 0) if control else (3 + 4, 20))


def test_bench_commands_against_the_server(served, capsys):
    from tensorfold.cli.main import main
    common = ["--url", served.url, "--max-tokens", "6"]
    assert main(["bench", "concurrent", *common, "--levels", "1,4", "--alone", "--serial", "--json"]) == 0
    assert "x4   4 requests: 0 unequal, 0 failed" in capsys.readouterr().out
    assert main(["bench", "cache", *common, "--repeat", "3", "--require-reuse"]) == 0
    assert "replies equal" in capsys.readouterr().out
    assert main(["bench", "openai", *common, "--reps", "1"]) == 0
    assert "tok/s" in capsys.readouterr().out


def test_an_engine_failure_is_a_500_and_the_server_serves_on(served, monkeypatch):
    net = served.server.model.net
    real = net.forward_logits

    def broken(windows, taps=()):
        raise RuntimeError("planted failure")

    monkeypatch.setattr(net, "forward_logits", broken)
    reply = httpx.post(served.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3})
    assert reply.status_code == 500 and "planted failure" in reply.json()["error"]["message"]
    with httpx.stream("POST", served.url + "/v1/completions",
                      json={"prompt": "x", "max_tokens": 3, "stream": True}) as streamed:
        assert any("planted failure" in line for line in streamed.iter_lines())
    monkeypatch.setattr(net, "forward_logits", real)
    assert httpx.post(served.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3}).status_code == 200
