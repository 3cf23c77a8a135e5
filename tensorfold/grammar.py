"""Grammars that constrain what a request generates: JSON that follows a schema, or a tool call in the model's own
XML form; compiled by llguidance against the checkpoint's tokenizer.json, and matched one token at a time.

A `Grammar` is compiled once per request, and refused (`GrammarError`, with llguidance's reason) when the library
cannot compile it. Each stream gets its own `Matcher`, which stands where the grammar is after the stream's output
so far: `mask` sets every logit the grammar does not allow next to -inf, and `advance` moves past the token drawn.
The engine masks every row it samples, drafted rows included, with the matcher of the tokens before that row, so
a constrained request stays drafted == undrafted (tensorfold/engine.py, `Engine._sample`).

JSON is written in one form, the form of Python's `json.dumps`: no whitespace but ", " between items and ": "
after keys. A schema may choose another through llguidance's own "x-guidance" key.
"""
import functools
import json
import re

import llguidance
import numpy as np

from tensorfold.errors import TensorfoldError

JSON_FORM = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(TensorfoldError, ValueError):
    """A schema, tool list or grammar that cannot constrain generation; the message says why."""


@functools.lru_cache(maxsize=4)
def vocabulary(tokenizer, vocab_size: int) -> llguidance.LLTokenizer:
    """The tokenizer as llguidance reads it (built once per model): `vocab_size` rows of logits, the ids past the
    tokenizer's own never allowed, and the checkpoint's stop ids allowed where the grammar may end."""
    return llguidance.LLTokenizer(tokenizer.to_json(), n_vocab=vocab_size, eos_token=list(tokenizer.stop_ids))


class Grammar:
    """A grammar compiled against one model's tokenizer; `matcher()` starts a stream at its beginning."""

    def __init__(self, tokenizer, vocab_size: int, source: str, what: str):
        self.vocab_size = vocab_size
        self._start = llguidance.LLMatcher(vocabulary(tokenizer, vocab_size), source, log_level=0)
        if self._start.is_error():
            raise GrammarError(f"{what}: {first_line(self._start.get_error())}")

    @classmethod
    def json(cls, tokenizer, vocab_size: int, schema: dict, reasoning: bool = False) -> "Grammar":
        """JSON that validates against `schema` (`{"type": "object"}` for any object); with `reasoning`, after
        free text that ends the think block the prompt opened."""
        if not isinstance(schema, dict):
            raise GrammarError(f"the schema must be a JSON object, got {type(schema).__name__}")
        form = schema.get("x-guidance", {})
        if not isinstance(form, dict):
            raise GrammarError("the schema's x-guidance must be an object of llguidance's JSON options")
        body = "%json " + json.dumps({**schema, "x-guidance": {**JSON_FORM, **form}})
        return cls(tokenizer, vocab_size, lark(vocabulary(tokenizer, vocab_size), body, reasoning), "the schema")

    @classmethod
    def tool_calls(cls, tokenizer, vocab_size: int, tools: list, name: str | None = None, parallel: bool = True,
                   reasoning: bool = False) -> "Grammar":
        """One tool call (several if `parallel`) to any of `tools`, or to the one called `name`, in the XML form of
        the chat template (tensorfold/model/chatml.jinja): each parameter the tool's schema declares, the required
        ones always and in its order, strings as raw text, other values as JSON of their own schema."""
        functions = [tool_function(tool, i) for i, tool in enumerate(tools)]
        if name is not None:
            functions = [f for f in functions if f["name"] == name]
        if not functions:
            raise GrammarError(f"no tool is called {name!r}" if name is not None else "there are no tools to call")
        vocab = vocabulary(tokenizer, vocab_size)
        choices = " | ".join(f"f{i}" for i in range(len(functions)))
        opening, closing = token(vocab, "<tool_call>"), token(vocab, "</tool_call>")
        rules = [f'call: {opening} "\\n" ({choices}) "</function>\\n" {closing}']
        for i, function in enumerate(functions):
            rules += function_rules(function, f"f{i}")
        body = 'call ("\\n" call)*' if parallel else "call"
        return cls(tokenizer, vocab_size, lark(vocab, body, reasoning, rules), "the tools")

    @classmethod
    def text(cls, tokenizer, vocab_size: int, reasoning: bool = False) -> "Grammar":
        """Text without tool calls: any token but the added ones (`<tool_call>` among them), until a stop id."""
        vocab = vocabulary(tokenizer, vocab_size)
        return cls(tokenizer, vocab_size, lark(vocab, "TEXT", reasoning, ["TEXT: /(?s:.*)/"]), "the text")

    def matcher(self) -> "Matcher":
        return Matcher(self._start.deep_copy(), self.vocab_size)


class Matcher:
    """Where one stream stands in its grammar."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int):
        self._matcher, self.vocab_size = matcher, vocab_size

    def allowed(self) -> np.ndarray:
        """bool [vocab_size]: the tokens the grammar allows next."""
        words = np.frombuffer(self._matcher.compute_bitmask(), "<u4")  # bit j of word w: token 32 w + j
        self._check()
        return np.unpackbits(words.view(np.uint8), bitorder="little")[:self.vocab_size].astype(bool)

    def mask(self, logits_row) -> np.ndarray:
        """A float32 copy of the row with every token the grammar does not allow next at -inf."""
        return np.where(self.allowed(), np.asarray(logits_row, np.float32), np.float32(-np.inf))

    def advance(self, token: int) -> None:
        """Move past `token`, which `mask` allowed."""
        self._matcher.consume_token(int(token))
        self._check()

    def _check(self) -> None:
        if self._matcher.is_error():
            raise GrammarError(f"the grammar failed while generating: {first_line(self._matcher.get_error())}")


def lark(vocab, body: str, reasoning: bool, rules=()) -> str:
    """A Lark grammar (llguidance's dialect) whose start is `body`; with `reasoning`, free text first, up to the
    `</think>` that closes the think block the prompt opened (the text cannot hold that token itself)."""
    if not reasoning:
        return "\n".join([f"start: {body}", *rules]) + "\n"
    start = f'start: THINK {token(vocab, "</think>")} "\\n\\n" {body}'
    return "\n".join([start, *rules, "THINK: /(?s:.*)/"]) + "\n"


def token(vocab: llguidance.LLTokenizer, text: str) -> str:
    """`text` in a grammar: the one token it encodes to when the tokenizer has it as an added token (as it has
    `<tool_call>`; llguidance matches such a token by its id, never by its characters), else its characters."""
    ids = vocab.tokenize_str(text)
    if len(ids) == 1 and vocab.is_special_token(ids[0]):
        return f"<[{ids[0]}]>"
    return json.dumps(text, ensure_ascii=False)


def tool_function(tool, index: int) -> dict:
    """An OpenAI tool's function: {"name", "parameters"}, checked."""
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise GrammarError(f"tools[{index}] must be an object whose function has a non-empty string name")
    if "<" in function["name"] or ">" in function["name"] or "\n" in function["name"]:
        raise GrammarError(f"tools[{index}].function.name may not hold '<', '>' or a newline")
    parameters = function.get("parameters") or {}
    if not isinstance(parameters, dict) or not isinstance(parameters.get("properties", {}), dict):
        raise GrammarError(f"tools[{index}].function.parameters must be a JSON schema object with properties")
    return {"name": function["name"], "parameters": parameters}


def function_rules(function: dict, rule: str) -> list:
    """The rules of one function's call: its opening tag, then its parameters."""
    parameters = function["parameters"]
    properties, required = parameters.get("properties", {}), set(parameters.get("required", []))
    shared = {key: parameters[key] for key in ("$defs", "definitions") if key in parameters}  # what $refs point at
    parts, rules = [json.dumps(f"<function={function['name']}>\n")], []
    for j, (key, schema) in enumerate(properties.items()):
        if not isinstance(key, str) or not key or any(c in key for c in "<>\n"):
            raise GrammarError(f"{function['name']}: the parameter name {key!r} is empty or holds <, > or a newline")
        name = f"{rule}_p{j}"
        parts.append(name if key in required else f"{name}?")
        rules.append(f"{name}: {json.dumps(f'<parameter={key}>' + chr(10))} {parameter_value(schema, shared)}")
    return [f"{rule}: {' '.join(parts)}", *rules]


def parameter_value(schema, shared: dict) -> str:
    """A parameter's value and closing tag: a string as raw text (one of its enum, when it has one), anything else
    as JSON of its schema."""
    close = json.dumps("\n</parameter>\n")
    if isinstance(schema, dict) and schema.get("type") == "string":
        if isinstance(schema.get("enum"), list) and all(isinstance(v, str) for v in schema["enum"]):
            return f"({' | '.join(json.dumps(v, ensure_ascii=False) for v in schema['enum'])}) {close}"
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (low, high or 0)):
            raise GrammarError(f"minLength and maxLength must be non-negative integers, got {low!r}, {high!r}")
        return f"/[^<]{{{low},{'' if high is None else high}}}\\n<\\/parameter>\\n/"  # raw text: anything but "<"
    schema = schema if isinstance(schema, dict) else {}
    return f"%json {json.dumps({**shared, **schema, 'x-guidance': JSON_FORM})} {close}"


def first_line(message: str) -> str:
    """llguidance's error message without the grammar dump that may follow it, nor the place in our own Lark
    text that it starts with ("at 1(8): ")."""
    line = " ".join(message.strip().splitlines()[0].split()) if message.strip() else "refused"
    return re.sub(r"^at \d+\(\d+\): ", "", line)
