"""Reading OpenAI-style request bodies into engine parameters, and the OpenAI error shape.

Every problem with a request becomes an `APIError` with an HTTP status and a message that names the field; the
app turns it into `{"error": {"message", "type", "param", "code"}}`. Unknown fields are ignored, as OpenAI-
compatible servers do.
"""
import dataclasses
import json

from tensorfold.engine import SamplingParams, check_ids
from tensorfold.errors import TensorfoldError

MAX_N = 8  # choices per request
MAX_DEPTH = 32  # nesting of arrays and objects in a body: far past any OpenAI request, far short of recursion limits
DEFAULT_CHAT_MAX_TOKENS = 1024  # a chat request without max_tokens: this many, or what its context leaves if fewer
# the template call's own keywords, which chat_template_kwargs may not override
TEMPLATE_KEYWORDS = frozenset({"self", "messages", "tools", "add_generation_prompt", "tokenize", "namespace",
                               "raise_exception", "kwargs"})


class APIError(Exception):
    """A request the server refuses: status 4xx, a message, and the parameter at fault."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.kind = kind or {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
                             413: "RequestTooLargeError", 415: "UnsupportedMediaTypeError", 429: "RateLimitError",
                             503: "ServiceUnavailableError"}.get(status, "APIError")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


def parse_body(raw: bytes) -> dict:
    """A request body as a JSON object of UTF-8 text, nested at most MAX_DEPTH deep, whose strings are all valid
    Unicode (a lone surrogate can be neither tokenized nor answered)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise APIError(415, "the body must be JSON in UTF-8") from None
    if text.startswith("\ufeff"):
        raise APIError(415, "the body must be JSON in UTF-8, without a byte order mark")
    try:
        body = json.loads(text)
    except RecursionError:
        raise APIError(400, f"the body nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:
        raise APIError(400, f"the body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise APIError(400, "the body must be a JSON object")
    check_values(body)
    return body


def check_values(body: dict) -> None:
    """Refuse nesting past MAX_DEPTH and strings with lone surrogates, naming the top-level field."""
    todo = [(value, 1, key) for key, value in body.items()] + [(key, 1, key) for key in body]
    while todo:
        value, depth, field = todo.pop()
        if depth > MAX_DEPTH:
            raise APIError(400, f"the body nests deeper than {MAX_DEPTH} levels", field)
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise APIError(400, f"{field} holds a lone surrogate (\\ud800 to \\udfff): not valid Unicode",
                               field) from None
        elif isinstance(value, list):
            todo.extend((item, depth + 1, field) for item in value)
        elif isinstance(value, dict):
            todo.extend((item, depth + 1, field) for item in value.values())
            todo.extend((key, depth + 1, field) for key in value)


def _number(body, name, default, integer=False):
    """A field that must be a JSON number (an integer where `integer`), or `default` when absent. Its range is the
    engine's check (`SamplingParams.problems`), or the caller's."""
    value = body.get(name)
    if value is None:
        return default
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok:
        raise APIError(400, f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}", name)
    return value


@dataclasses.dataclass
class Generation:
    """What a completion request asks for, beyond its prompt."""
    params: SamplingParams
    n: int
    stream: bool
    include_usage: bool
    stop: list  # stop strings


def read_logprobs(body: dict, chat: bool):
    """None, or how many alternatives to report per token: chat's `logprobs: true` + `top_logprobs: k`, or the
    completions API's `logprobs: k`."""
    if chat:
        wanted = body.get("logprobs")
        if wanted not in (None, True, False):
            raise APIError(400, f"logprobs must be true or false, got {wanted!r}", "logprobs")
        top = _number(body, "top_logprobs", 0, integer=True)
        if top and not wanted:
            raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        return top if wanted else None
    return _number(body, "logprobs", None, integer=True)


def read_generation(body: dict, default_max_tokens: int, chat: bool) -> Generation:
    """The sampling and output fields shared by /v1/completions and /v1/chat/completions."""
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _number(body, name, default_max_tokens, integer=True)
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop) and len(stop) <= 16):
        raise APIError(400, "stop must be a non-empty string or a list of up to 16 non-empty strings", "stop")
    draft = body.get("draft")
    draft = True if draft is None else draft
    if not isinstance(draft, bool):
        raise APIError(400, f"draft must be true or false, got {draft!r}", "draft")
    stream = body.get("stream")
    stream = False if stream is None else stream
    if not isinstance(stream, bool):
        raise APIError(400, f"stream must be true or false, got {stream!r}", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise APIError(400, "stream_options must be an object", "stream_options")
    if body.get("logit_bias") not in (None, {}):
        raise APIError(400, "logit_bias is not supported by this server yet", "logit_bias")
    top_k = _number(body, "top_k", 0, integer=True)
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0),
        top_p=_number(body, "top_p", 1.0),
        top_k=0 if top_k == -1 else top_k,  # -1 means off, as in vLLM
        min_p=_number(body, "min_p", 0.0),
        seed=_number(body, "seed", None, integer=True),
        presence_penalty=_number(body, "presence_penalty", 0.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0),
        logprobs=read_logprobs(body, chat),
        draft=draft)
    problems = params.problems()
    if problems:
        field, message = next(iter(problems.items()))
        names = {"max_tokens": name, "logprobs": "top_logprobs" if chat else "logprobs"}  # the request's names
        raise APIError(400, message, names.get(field, field))
    n = _number(body, "n", 1, integer=True)
    if not 1 <= n <= MAX_N:
        raise APIError(400, f"n must be an integer between 1 and {MAX_N}, got {n!r}", "n")
    return Generation(params, n, stream, bool(options.get("include_usage", False)), stop)


def read_messages(body: dict) -> list:
    """The chat messages, with each assistant tool call's arguments as an object (the template's form), whether
    they came as OpenAI's JSON string or as an object."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "messages must be a non-empty list", "messages")
    read = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise APIError(400, f"messages[{i}] must be an object with a string role", "messages")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise APIError(400, f"messages[{i}].content must be a string or a list of parts", "messages")
        if message.get("tool_calls") is not None:
            message = {**message, "tool_calls": read_tool_calls(message["tool_calls"], f"messages[{i}].tool_calls")}
        read.append(message)
    return read


def read_tool_calls(calls, where: str) -> list:
    if not isinstance(calls, list):
        raise APIError(400, f"{where} must be a list of tool calls", "messages")
    read = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise APIError(400, f"{where}[{j}] must be an object whose function has a string name", "messages")
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except (ValueError, RecursionError):
                raise APIError(400, f"{where}[{j}].function.arguments is not valid JSON", "messages") from None
        elif arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise APIError(400, f"{where}[{j}].function.arguments must be a JSON object (or a string of one)",
                           "messages")
        check_values({"messages": arguments})
        read.append({**call, "function": {**function, "arguments": arguments}})
    return read


def read_template_kwargs(body: dict) -> dict:
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise APIError(400, "chat_template_kwargs must be an object", "chat_template_kwargs")
    taken = sorted(TEMPLATE_KEYWORDS.intersection(kwargs))
    if taken:
        raise APIError(400, f"chat_template_kwargs may not set {', '.join(taken)}: the server sets those",
                       "chat_template_kwargs")
    return kwargs


def read_prompt(body: dict, vocab_size: int):
    """The prompt of /v1/completions: a string, or a list of token ids (one prompt per request)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return read_ids(prompt, vocab_size, "prompt")
    raise APIError(400, "prompt must be a non-empty string or a non-empty list of token ids (one prompt)", "prompt")


def read_ids(ids: list, vocab_size: int, field: str) -> list:
    """A list of JSON integers as token ids (`check_ids`), or a 400 naming `field`."""
    try:
        return check_ids(ids, vocab_size)
    except TensorfoldError as e:
        raise APIError(400, f"{field}: {e}", field) from None
