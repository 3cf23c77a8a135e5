"""Reading OpenAI-style request bodies into engine parameters, and the OpenAI error shape.

Every problem with a request becomes an `APIError` with an HTTP status and a message that names the field; the
app turns it into `{"error": {"message", "type", "param", "code"}}`. Each route reads the fields of its table
(`FIELDS`) and refuses any other, so that no field is silently ignored; null is "not given" for every field.
"""
import dataclasses
import json

from tensorfold.errors import TensorfoldError
from tensorfold.request import check_ids
from tensorfold.sampling import SamplingParams

MAX_N = 8  # choices per request
MAX_DEPTH = 32  # nesting of arrays and objects in a body: far past any OpenAI request, far short of recursion limits
DEFAULT_CHAT_MAX_TOKENS = 1024  # a chat request without max_tokens: this many, or what its context leaves if fewer
# The fields each route reads (docs/serving.rst, "Request fields", says what each does).
SHARED_FIELDS = frozenset({
    "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "n", "stop",
    "stream", "stream_options", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
    "stop_token_ids", "logprobs", "draft", "user"})
FIELDS = {
    "chat": SHARED_FIELDS | {"messages", "tools", "tool_choice", "response_format", "parallel_tool_calls",
                             "chat_template_kwargs", "top_logprobs", "add_generation_prompt",
                             "continue_final_message"},
    "completions": SHARED_FIELDS | {"prompt", "echo", "best_of", "response_format"},
}
STREAM_OPTIONS = frozenset({"include_usage"})
# Fields a route knows but refuses, with the reason.
REFUSED = {"completions": {"suffix": "suffix is not supported: this server does not insert text before a suffix"}}
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


def check_fields(body: dict, route: str) -> None:
    """Refuse (400, naming it) every field that `route` does not read and that is not null."""
    for name, value in body.items():
        if value is None:
            continue
        if name in REFUSED.get(route, {}):
            raise APIError(400, REFUSED[route][name], name)
        if name not in FIELDS[route]:
            raise APIError(400, f"Unrecognized request argument supplied: {name} (this server does not read it)",
                           name)


def _flag(body, name, default: bool) -> bool:
    """A field that must be true or false, or `default` when absent."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise APIError(400, f"{name} must be true or false, got {value!r}", name)
    return value


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
    echo: bool = False  # (completions) the prompt's text before the output, and its logprobs when asked


def read_logprobs(body: dict, chat: bool):
    """None, or how many alternatives to report per token: chat's `logprobs: true` + `top_logprobs: k`, or the
    completions API's `logprobs: k`."""
    if chat:
        wanted = _flag(body, "logprobs", False)
        top = _number(body, "top_logprobs", 0, integer=True)
        if top and not wanted:
            raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        return top if wanted else None
    return _number(body, "logprobs", None, integer=True)


def read_logit_bias(body: dict, vocab_size: int) -> dict | None:
    """OpenAI's logit_bias, {"token id": bias}, as {id: bias}: ids in the vocabulary, biases from -100 to 100."""
    bias = body.get("logit_bias")
    if bias is None or bias == {}:
        return None
    if not isinstance(bias, dict):
        raise APIError(400, "logit_bias must be an object mapping token ids to biases", "logit_bias")
    read = {}
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit()):
            raise APIError(400, f"logit_bias: {key!r} is not a token id", "logit_bias")
        if not 0 <= int(key) < vocab_size:
            raise APIError(400, f"logit_bias: token id {key} is outside the vocabulary (0 .. {vocab_size - 1})",
                           "logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise APIError(400, f"logit_bias: the bias of token {key} must be a number from -100 to 100, got "
                           f"{value!r}", "logit_bias")
        read[int(key)] = value
    return read


def read_stop_ids(body: dict, vocab_size: int, model_stop_ids) -> tuple | None:
    """The stop ids: the model's own plus `stop_token_ids`; None (the model's own) when none are given."""
    extra = body.get("stop_token_ids")
    if extra is None:
        return None
    if not (isinstance(extra, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in extra)):
        raise APIError(400, "stop_token_ids must be a list of token ids", "stop_token_ids")
    return tuple(dict.fromkeys([*model_stop_ids, *read_ids(extra, vocab_size, "stop_token_ids")]))


def read_stream_options(body: dict) -> bool:
    """Whether `stream_options` asks for the usage chunk."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise APIError(400, "stream_options must be an object", "stream_options")
    unknown = sorted(set(options) - STREAM_OPTIONS)
    if unknown:
        raise APIError(400, f"stream_options.{unknown[0]} is not supported (only include_usage)", "stream_options")
    return _flag(options, "include_usage", False)


def read_template_flags(body: dict) -> tuple:
    """(add_generation_prompt, continue_final_message) of a chat request; both true is refused, as vLLM does."""
    add = _flag(body, "add_generation_prompt", True)
    continuing = _flag(body, "continue_final_message", False)
    if add and continuing:
        raise APIError(400, "continue_final_message needs add_generation_prompt: false (the two cannot both be "
                       "true)", "continue_final_message")
    return add, continuing


def read_generation(body: dict, default_max_tokens: int, chat: bool, vocab_size: int,
                    model_stop_ids=()) -> Generation:
    """The sampling and output fields of /v1/completions and /v1/chat/completions (`chat`); `model_stop_ids` are
    the checkpoint's, which stop_token_ids adds to."""
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _number(body, name, default_max_tokens, integer=True)
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str) and stop:
        stop = [stop]
    elif not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop) and len(stop) <= 16):
        raise APIError(400, "stop must be a non-empty string or a list of up to 16 non-empty strings", "stop")
    draft, stream = _flag(body, "draft", True), _flag(body, "stream", False)
    echo = False if chat else _flag(body, "echo", False)
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise APIError(400, f"user must be a string, got {body['user']!r}", "user")
    logprobs = read_logprobs(body, chat)
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
        repetition_penalty=_number(body, "repetition_penalty", 1.0),
        logit_bias=read_logit_bias(body, vocab_size),
        stop_ids=read_stop_ids(body, vocab_size, model_stop_ids),
        logprobs=logprobs,
        prompt_logprobs=logprobs if echo else None,
        draft=draft)
    problems = params.problems()
    if problems:
        field, message = next(iter(problems.items()))
        names = {"max_tokens": name, "logprobs": "top_logprobs" if chat else "logprobs",  # the request's names
                 "prompt_logprobs": "logprobs"}
        raise APIError(400, message, names.get(field, field))
    n = _number(body, "n", 1, integer=True)
    if not 1 <= n <= MAX_N:
        raise APIError(400, f"n must be an integer between 1 and {MAX_N}, got {n!r}", "n")
    best_of = _number(body, "best_of", n, integer=True)
    if best_of != n:
        raise APIError(400, f"best_of must equal n ({n}): this server returns every choice it makes, got {best_of}",
                       "best_of")
    return Generation(params, n, stream, read_stream_options(body), stop, echo)


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
