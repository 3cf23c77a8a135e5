"""The requests that tools/probe_server.py sends: every field of /v1/completions and /v1/chat/completions with
values of the wrong type, null, out of range, huge, holding lone surrogates or nested deep; bad JSON, wrong media
types, bad keys, unknown routes and methods, tool-call shapes, chat_template_kwargs collisions, seeds and n at their
edges, and requests that only the HTTP parser sees.

A case is a dict: `group`, `name`, `method`, `route`, `body` (bytes), `headers`, `expect` and `field` (the field at
fault, which a 400 must name). `expect` is "answer" (a 2xx, or an OpenAI-shaped 4xx), "new" (a field the server may
not know yet: a 400 is right, a 2xx acceptable for now), "http" (malformed HTTP: any 4xx, or a closed connection)
or a tuple of the right statuses. A case with `raw` is sent as those bytes on a socket; `auth: False` sends no key; `slow` ones (answers to the chat
default of max_tokens) get four times the timeout.
"""
import json

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
USER = [{"role": "user", "content": "Speak, friend."}]
BASES = {CHAT: {"messages": USER, "max_tokens": 2, "temperature": 0},
         COMPLETIONS: {"prompt": "ROMEO:", "max_tokens": 2, "temperature": 0}}
JSON = {"content-type": "application/json"}


class Raw(str):
    """JSON text put into a body as it is: NaN, Infinity, integers of 5,000 digits, nesting past any encoder."""


def nested(depth: int, leaf=1):
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


HOSTILE = {  # for every field
    "null": None, "true": True, "false": False, "0": 0, "-1": -1, "1": 1, "0.5": 0.5, "2^31": 2**31, "2^63": 2**63,
    "2^64": 2**64, "-2^63-1": -2**63 - 1, "1e308": 1e308, "empty string": "", "string": "x", "numeric string": "4",
    "lone surrogate": "\ud800", "empty list": [], "list": [1, "x"], "object": {"a": 1}, "empty object": {},
    "nested 40": nested(40), "NaN": Raw("NaN"), "Infinity": Raw("Infinity"), "5000 digits": Raw("9" * 5000),
}
HOSTILE_TEXT = {  # more, for the fields whose strings and lists the server reads further
    **HOSTILE, "lone low surrogate": "a\udfffb", "emoji": "日本🎭", "control characters": "\x00\x1b[31m",
    "template text": "{{ 7 * 7 }}{% raw %}", "special token": "<|im_end|>", "500k string": "a" * 500_000,
    "strings": ["a", "b"], "100k ints": list(range(100_000)), "-Infinity": Raw("-Infinity"), "1e400": Raw("1e400"),
    "nested 100000": Raw("[" * 100_000 + "]" * 100_000),
}
NUMBER, INTEGER = (int, float), (int,)
COMMON = {"model": (str,), "max_tokens": INTEGER, "max_completion_tokens": INTEGER, "temperature": NUMBER,
          "top_p": NUMBER, "top_k": INTEGER, "min_p": NUMBER, "seed": INTEGER, "stop": (str, list), "n": INTEGER,
          "stream": (bool,), "stream_options": (dict,), "presence_penalty": NUMBER, "frequency_penalty": NUMBER,
          "draft": (bool,), "logit_bias": (dict,)}
FIELDS = {CHAT: {**COMMON, "messages": (list,), "logprobs": (bool,), "top_logprobs": INTEGER, "tools": (list,),
                 "chat_template_kwargs": (dict,)},
          COMPLETIONS: {**COMMON, "prompt": (str, list), "logprobs": INTEGER}}
# OpenAI fields this server may not read yet, and names no API has: a 400 is right, a 2xx acceptable for now
NEW_FIELDS = ["echo", "suffix", "best_of", "response_format", "tool_choice", "parallel_tool_calls", "user",
              "service_tier", "metadata", "store", "reasoning_effort", "functions", "no_such_field"]
NEW_VALUES = ["null", "1", "object", "lone surrogate"]
TEXT_FIELDS = {"model", "stop", "stream_options", "logit_bias", "messages", "prompt", "tools", "chat_template_kwargs"}


def encode(body) -> bytes:
    """`body` as JSON bytes, with each Raw value written as its text."""
    raws = {}

    def mark(value):
        if isinstance(value, Raw):
            raws[f"@raw{len(raws)}@"] = value
            return f"@raw{len(raws) - 1}@"
        if isinstance(value, dict):
            return {k: mark(v) for k, v in value.items()}
        if isinstance(value, list):
            return [mark(v) for v in value]
        return value

    text = json.dumps(mark(body))
    for key, raw in raws.items():
        text = text.replace(f'"{key}"', raw)
    return text.encode()


def case(group, name, route, body=None, expect="answer", field=None, method="POST", headers=None, content=None,
         **extra) -> dict:
    content = encode(body) if content is None and body is not None else content
    return {"group": group, "name": name, "method": method, "route": route, "body": content or b"",
            "headers": {**JSON, **(headers or {})} if method == "POST" else dict(headers or {}), "expect": expect,
            "field": field, **extra}


def field_cases() -> list:
    """Each field of each generation route set to each hostile value, the rest of the body good."""
    found = []
    for route, fields in FIELDS.items():
        for field, types in fields.items():
            for name, value in (HOSTILE_TEXT if field in TEXT_FIELDS else HOSTILE).items():
                body = {**BASES[route], field: value}
                lax = value is not None and not isinstance(value, Raw) and not (
                    isinstance(value, types) and (bool in types or not isinstance(value, bool)))
                slow = route == CHAT and field == "max_tokens" and value is None  # to the default: a long answer
                found.append(case("fields", f"{route} {field}={name}", route, body, field=field, wrong_type=lax,
                                  slow=slow))
        for field in NEW_FIELDS:
            for name in NEW_VALUES:
                found.append(case("new fields", f"{route} {field}={name}", route,
                                  {**BASES[route], field: HOSTILE[name]}, expect="new", field=field))
    return found


def edge_cases(context: int, max_queue: int) -> list:
    """Values at the ends of each range: just inside answers 200, just outside 400 naming the field."""
    found = []
    in_range = {"seed": [-2**63, -1, 0, 2**63 - 1, 2**63, 2**64 - 1], "temperature": [0, 100, 1e-300],
                "top_p": [1e-300, 1], "top_k": [-1, 0, 2**31 - 1], "min_p": [0, 1], "presence_penalty": [-2, 2],
                "frequency_penalty": [2, -2], "max_tokens": [1], "n": [1, max_queue]}
    outside = {"seed": [-2**63 - 1, 2**64, 2**64 + 1], "temperature": [-1e-300, 100.0001], "top_p": [0, 1.0000001],
               "top_k": [-2, 2**31], "min_p": [-0.01, 1.01], "presence_penalty": [-2.01, 2.01],
               "frequency_penalty": [2.0001], "max_tokens": [0, context], "n": [0, max_queue + 1, 9]}
    for route in (CHAT, COMPLETIONS):
        for field, values in in_range.items():
            for value in values:
                found.append(case("edges", f"{route} {field}={value}", route, {**BASES[route], field: value},
                                  expect=(200,), field=field))
        for field, values in outside.items():
            for value in values:
                found.append(case("edges", f"{route} {field}={value}", route, {**BASES[route], field: value},
                                  expect=(400,), field=field))
        for seed in (-1, 2**64 - 1, 2**63):
            found.append(case("edges", f"{route} n=2 seed={seed}", route, {**BASES[route], "n": 2, "seed": seed},
                              expect=(200,), field="seed"))
        nulls = {name: None for name in ("max_completion_tokens", "stream", "draft", "stop", "n", "seed",
                                         "temperature", "stream_options", "logprobs", "top_p", "top_k", "logit_bias")}
        found.append(case("edges", f"{route} every optional field null", route,
                          {**BASES[route], "max_tokens": 5, **nulls}, expect=(200,), max_completion_tokens=5))
        found.append(case("edges", f"{route} stop at 16 strings", route, {**BASES[route], "stop": ["q"] * 16},
                          expect=(200,), field="stop"))
        found.append(case("edges", f"{route} stop at 17 strings", route, {**BASES[route], "stop": ["q"] * 17},
                          expect=(400,), field="stop"))
        found.append(case("edges", f"{route} stop of an empty string", route, {**BASES[route], "stop": [""]},
                          expect=(400,), field="stop"))
    found.append(case("edges", "completions logprobs=20", COMPLETIONS, {**BASES[COMPLETIONS], "logprobs": 20},
                      expect=(200,)))
    found.append(case("edges", "completions logprobs=21", COMPLETIONS, {**BASES[COMPLETIONS], "logprobs": 21},
                      expect=(400,), field="logprobs"))
    found.append(case("edges", "chat top_logprobs=20", CHAT, {**BASES[CHAT], "logprobs": True, "top_logprobs": 20},
                      expect=(200,)))
    found.append(case("edges", "chat top_logprobs=21", CHAT, {**BASES[CHAT], "logprobs": True, "top_logprobs": 21},
                      expect=(400,), field="top_logprobs"))
    found.append(case("edges", "chat top_logprobs without logprobs", CHAT, {**BASES[CHAT], "top_logprobs": 2},
                      expect=(400,), field="top_logprobs"))
    found.append(case("edges", "chat without max_tokens (the default)", CHAT, {"messages": USER, "temperature": 0},
                      expect=(200,), max_completion_tokens=context, slow=True))
    return found


def tool_call(arguments, name="get_weather"):
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_turn(calls):
    return [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 21}'}]


TOOL = {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def chat_cases() -> list:
    """Messages, parts, tool calls, tools and chat_template_kwargs in every shape, on the chat route and /tokenize."""
    found = []
    messages = {
        "message null": [None], "message a string": ["hi"], "message a list": [[USER[0]]],
        "no role": [{"content": "x"}], "no content": [{"role": "user"}], "content null": [{"role": "user", "content": None}],
        "unknown role": [{"role": "wizard", "content": "x"}], "role an int": [{"role": 5, "content": "x"}],
        "content an int": [{"role": "user", "content": 5}], "content an object": [{"role": "user", "content": {"a": 1}}],
        "text part": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "image part": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}],
        "part without text": [{"role": "user", "content": [{"type": "text"}]}],
        "part text an int": [{"role": "user", "content": [{"type": "text", "text": 5}]}],
        "part null": [{"role": "user", "content": [None]}], "part a list": [{"role": "user", "content": [[[]]]}],
        "system last": [USER[0], {"role": "system", "content": "be brief"}],
        "assistant only": [{"role": "assistant", "content": "x"}],
        "tool without a call": [{"role": "tool", "content": "x"}],
        "tool_call_id an object": [{"role": "tool", "tool_call_id": {"a": 1}, "content": "x"}],
        "name field": [{"role": "user", "name": {"a": [1]}, "content": "x"}],
        "1000 messages": USER * 1000, "content 3 MB": [{"role": "user", "content": "thou " * 600_000}],
        "reasoning_content": [USER[0], {"role": "assistant", "content": "x", "reasoning_content": 5}, USER[0]],
    }
    calls = {
        "arguments a JSON string": [tool_call('{"city": "Paris", "days": [1, 2]}')],
        "arguments an object": [tool_call({"city": "Paris"})], "arguments empty": [tool_call("")],
        "arguments null": [tool_call(None)], "tool_calls a number": 5, "tool_calls an object": {"a": 1},
        "name null": [tool_call({"city": "Paris"}, name=None)], "name a list": [tool_call({}, name=["f"])],
        "arguments a list": [tool_call([1])], "arguments a string of a list": [tool_call("[1]")],
        "arguments not JSON": [tool_call("{not json")], "arguments a string of a string": [tool_call('"x"')],
        "arguments nested 100000": [tool_call("[" * 100_000 + "]" * 100_000)],
        "arguments with a lone surrogate": [tool_call('{"city": "\\ud800"}')],
        "arguments of 5000 digits": [tool_call('{"n": ' + "9" * 5000 + "}")],
        "call a string": ["call"], "call empty": [{}], "function a string": [{"function": "f"}],
        "100 calls": [tool_call({"city": str(i)}) for i in range(100)],
        "tool_calls on a user message": None,
    }
    tools = {"good tool": [TOOL], "tools a number": 5, "tools empty": [], "tools strings": ["f"],
             "tool empty object": [{}], "tool function null": [{"type": "function", "function": None}],
             "tool name a number": [{"type": "function", "function": {"name": 5}}],
             "tool parameters nested": [{"type": "function", "function": {"name": "f", "parameters": nested(30, {})}}],
             "300 tools": [TOOL] * 300}
    kwargs = {**{f"kwargs {k}": {k: 1} for k in ("add_generation_prompt", "tools", "tokenize", "namespace",
                                                  "raise_exception", "messages", "kwargs", "self")},
              "kwargs enable_thinking true": {"enable_thinking": True},
              "kwargs enable_thinking a string": {"enable_thinking": "no"},
              "kwargs range": {"range": 1}, "kwargs loop": {"loop": None}, "kwargs dunder": {"__class__": 1},
              "kwargs a list": [1], "kwargs a string": "x", "kwargs 1000 keys": {f"k{i}": i for i in range(1000)},
              "kwargs key with a dash": {"a-b": 1}, "kwargs key empty": {"": 1}}
    for route in (CHAT, "/tokenize"):
        extra = {"max_tokens": 2, "temperature": 0} if route == CHAT else {}
        for name, value in messages.items():
            found.append(case("messages", f"{route} {name}", route, {"messages": value, **extra}))
        for name, value in calls.items():
            turn = ([{"role": "user", "content": "x", "tool_calls": [tool_call({})]}] if value is None
                    else tool_turn(value))
            found.append(case("tool calls", f"{route} {name}", route, {"messages": turn, **extra}))
        for name, value in tools.items():
            found.append(case("tools", f"{route} {name}", route, {"messages": USER, "tools": value, **extra},
                              field="tools"))
        for name, value in kwargs.items():
            found.append(case("template kwargs", f"{route} {name}", route,
                              {"messages": USER, "chat_template_kwargs": value, **extra},
                              field="chat_template_kwargs"))
    return found


def prompt_cases(vocab: int) -> list:
    """Prompts and token lists on /v1/completions, /tokenize and /detokenize."""
    found = []
    prompts = {"ids": [1, 2, 3], "last id": [vocab - 1], "id past the vocabulary": [vocab], "negative id": [-1],
               "id 2^64": [2**64], "id a bool": [True], "id a float": [1.0], "ids nested": [[1, 2]],
               "one string in a list": ["ROMEO:"], "two strings (a batch)": ["a", "b"], "two id lists": [[1], [2]],
               "empty list": [], "empty string": "", "list of null": [None], "3 MB prompt": "thou art " * 350_000,
               "100k ids": [5] * 100_000, "whitespace": " \n\t", "lone surrogate": "\udc00"}
    for route in (COMPLETIONS, "/tokenize"):
        extra = {"max_tokens": 2, "temperature": 0} if route == COMPLETIONS else {}
        for name, value in prompts.items():
            found.append(case("prompts", f"{route} prompt {name}", route, {"prompt": value, **extra}, field="prompt"))
        found.append(case("prompts", f"{route} no prompt", route, {**extra}, expect=(400,), field="prompt"))
    tokens = {"ids": [1, 2, 3], "empty": [], "past the vocabulary": [vocab], "negative": [-1], "a bool": [True],
              "a string": "abc", "null": None, "nested": [[1]], "floats": [1.5], "2^70": [2**70],
              "500k ids": [7] * 500_000, "an object": {"a": 1}}
    for name, value in tokens.items():
        found.append(case("prompts", f"/detokenize tokens {name}", "/detokenize", {"tokens": value}, field="tokens"))
    return found


GOOD = encode({**BASES[COMPLETIONS]})


def media_cases() -> list:
    """Bodies that are not UTF-8 JSON objects, and media types that are not application/json."""
    found = []
    types = {"text/plain": (415,), "application/x-www-form-urlencoded": (415,), "multipart/form-data": (415,),
             "application/json; charset=utf-16": (415,), "application/json; charset=latin-1": (415,),
             "application/jsonx": (415,), "APPLICATION/JSON; charset=UTF-8": (200,), "": (415,)}
    for media, expect in types.items():
        found.append(case("media", f"content-type {media!r}", COMPLETIONS, content=GOOD, expect=expect,
                          headers={"content-type": media}))
    text = json.dumps(BASES[COMPLETIONS])
    bodies = {"utf-16": (text.encode("utf-16"), (415,)), "utf-32": (text.encode("utf-32"), (415,)),
              "byte order mark": (b"\xef\xbb\xbf" + text.encode(), (415,)), "latin-1 bytes": (b'{"prompt": "\xe9"}', (415,)),
              "empty": (b"", (400,)), "whitespace": (b"  \n ", (400,)), "null": (b"null", (400,)),
              "a list": (b"[1, 2]", (400,)), "a string": (b'"ROMEO"', (400,)), "a number": (b"5", (400,)),
              "cut": (text[:-3].encode(), (400,)), "trailing garbage": (text.encode() + b" }", (400,)),
              "single quotes": (b"{'prompt': 'x'}", (400,)), "bad escape": (b'{"prompt": "\\x41"}', (400,)),
              "short unicode escape": (b'{"prompt": "\\u12"}', (400,)), "raw control character": (b'{"prompt": "a\x01"}', (400,)),
              "duplicate keys": (b'{"prompt": 5, "prompt": "ROMEO:", "max_tokens": 2}', (200,)),
              "NUL bytes": (b"\x00" * 64, (400,)), "nested 100000": (b"[" * 100_000 + b"]" * 100_000, (400,)),
              "object nested 100000": (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, (400,)),
              "5 MiB": (b'{"prompt": "' + b"a" * (5 << 20) + b'"}', (413,))}
    for name, (content, expect) in bodies.items():
        found.append(case("bad JSON", f"body {name}", COMPLETIONS, content=content, expect=expect))
    return found


def auth_cases(key: str) -> list:
    """Wrong, missing and odd keys on every protected route; /health and /metrics need none."""
    found = []
    wrong = {"no header": None, "wrong key": f"Bearer {key}x", "key prefix": f"Bearer {key[:-1]}",
             "lower-case scheme": f"bearer {key}", "Basic": "Basic cHJvYmU6a2V5",
             "scheme only": "Bearer", "key only": key, "two spaces": f"Bearer  {key}", "empty": "",
             "10 kB": "Bearer " + "k" * 10_000, "latin-1 bytes": "Bearer cl\xe9"}
    routes = {"/v1/models": ("GET", b""), COMPLETIONS: ("POST", GOOD), CHAT: ("POST", encode(BASES[CHAT])),
              "/tokenize": ("POST", b'{"prompt": "x"}'), "/detokenize": ("POST", b'{"tokens": [1]}')}
    for route, (method, body) in routes.items():
        for name, header in wrong.items():  # sent raw: an HTTP client refuses some of these headers
            line = b"" if header is None else b"authorization: " + header.encode("latin-1") + b"\r\n"
            raw = (f"{method} {route} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json"
                   f"\r\ncontent-length: {len(body)}\r\n").encode() + line + b"\r\n" + body
            found.append(case("auth", f"{method} {route} {name}", route, method=method, raw=raw, expect=(401,),
                              auth=False))
        found.append(case("auth", f"{method} {route} right key", route, content=body, method=method, expect=(200,)))
    for route in ("/health", "/metrics"):
        found.append(case("auth", f"GET {route} without a key", route, method="GET", expect=(200,), auth=False))
    return found


def route_cases() -> list:
    """Unknown routes, and methods a route does not take."""
    found = []
    for route in ("/", "/v1", "/v1/", "/v1/completion", "/v2/completions", "/v1/embeddings", "/v1/models/tiny",
                  "/%2e%2e/%2e%2e/etc/passwd", "/v1/chat/completions%00", "/" + "a" * 6000,
                  "/\u00e9t\u00e9"):
        for method in ("GET", "POST"):
            found.append(case("routes", f"{method} {route[:40]}", route, content=b"{}", method=method,
                              expect=(404, 405, 307)))
    methods = {"/v1/completions": ("GET", "PUT", "DELETE", "PATCH", "OPTIONS"), CHAT: ("GET", "PUT", "DELETE"),
               "/tokenize": ("GET", "PUT"), "/detokenize": ("GET",), "/health": ("POST", "PUT", "DELETE"),
               "/metrics": ("POST",), "/v1/models": ("POST", "DELETE")}
    for route, names in methods.items():
        for method in names:
            found.append(case("routes", f"{method} {route}", route, content=b"{}", method=method, expect=(405,)))
    found.append(case("routes", "HEAD /health", "/health", method="HEAD", expect=(200,)))
    found.append(case("routes", "POST /v1/chat/completions/ (a trailing slash)", CHAT + "/", BASES[CHAT],
                      expect=(307, 404)))
    return found


def http_cases() -> list:
    """Requests only the HTTP parser sees, sent as raw bytes: each gets a 4xx of any shape, or its connection is
    closed; a 413 and a 200 where the request is well-formed."""
    head = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nconnection: close\r\n"
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (GOOD[:10], GOOD[10:])) + b"0\r\n\r\n"
    raw = {
        "chunked body": (head + b"transfer-encoding: chunked\r\n\r\n" + chunked, (200,)),
        "content-length not a number": (head + b"content-length: abc\r\n\r\n" + GOOD, "http"),
        "negative content-length": (head + b"content-length: -1\r\n\r\n" + GOOD, "http"),
        "content-length of a terabyte": (head + b"content-length: 1000000000000\r\n\r\n" + GOOD, (413,)),
        "two content-lengths": (head + b"content-length: 5\r\ncontent-length: 9\r\n\r\n" + GOOD, "http"),
        "content-length and chunked": (head + b"content-length: 5\r\ntransfer-encoding: chunked\r\n\r\n" + chunked,
                                       "http"),
        "bad chunk size": (head + b"transfer-encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", "http"),
        "garbage": (b"HELLO\r\n\r\n", "http"), "HTTP/2 preface": (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "http"),
        "header of 100 kB": (head + b"x-big: " + b"a" * 100_000 + b"\r\n\r\n", "http"),
        "2000 headers": (head + b"".join(b"x-h%d: v\r\n" % i for i in range(2000)) + b"\r\n", "http"),
        "NUL in a header": (head + b"x-bad: a\x00b\r\ncontent-length: 2\r\n\r\n{}", "http"),
        "no host, HTTP/1.0": (b"GET /health HTTP/1.0\r\n\r\n", (200,)),
        "method FOO": (b"FOO /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n", (405,)),
        "dot segments": (b"GET /v1/../health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n", (404,)),
        "absolute URI": (b"GET http://elsewhere/health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
                         (200, 404)),
        "expect 100-continue": (head + b"expect: 100-continue\r\ncontent-length: %d\r\n\r\n" % len(GOOD) + GOOD,
                                (200,)),
    }
    return [case("http", name, (data.split(b" ") + [b"?"])[1].decode(errors="replace"), raw=data, expect=expect)
            for name, (data, expect) in raw.items()]


def all_cases(context: int, max_queue: int, vocab: int, key: str) -> list:
    return (field_cases() + edge_cases(context, max_queue) + chat_cases() + prompt_cases(vocab) + media_cases()
            + auth_cases(key) + route_cases() + http_cases())
