"""Structured outputs: a request's `response_format`, `tool_choice` and `parallel_tool_calls` read into the grammar
that constrains its choices (tensorfold/grammar.py), or a 400 that names the field."""
from tensorfold.grammar import Grammar, GrammarError
from tensorfold.serve.protocol import APIError

ANY_OBJECT = {"type": "object"}


def read_grammar(body: dict, model, chat: bool, reasoning: bool = False) -> Grammar | None:
    """The grammar of a request, or None when it asks for none. `chat` reads the tool fields too; `reasoning`: the
    prompt opened a think block, which the grammar lets the model close before the constrained part."""
    schema = read_response_format(body.get("response_format"))
    choice, name = read_tool_choice(body) if chat else (None, None)
    tokenizer, vocab_size = model.tokenizer, model.config.vocab_size
    parallel = body.get("parallel_tool_calls") if chat else None
    if parallel is not None and not isinstance(parallel, bool):
        raise APIError(400, f"parallel_tool_calls must be true or false, got {parallel!r}", "parallel_tool_calls")
    if parallel is False and choice not in ("required", "function"):  # only a tool-call grammar can hold it to one
        raise APIError(400, "parallel_tool_calls: false is supported only with tool_choice \"required\" or a named "
                            "function: otherwise an answer may hold several tool calls", "parallel_tool_calls")
    try:
        if choice in ("required", "function"):
            if schema is not None:
                raise APIError(400, "response_format asks for JSON, tool_choice for a tool call: choose one",
                               "response_format")
            return Grammar.tool_calls(tokenizer, vocab_size, body["tools"], name, parallel is not False, reasoning)
        if schema is not None:
            return Grammar.json(tokenizer, vocab_size, schema, reasoning)
        if choice == "none" and body.get("tools"):
            return Grammar.text(tokenizer, vocab_size, reasoning)
    except GrammarError as e:
        field = "response_format" if schema is not None else "tools"
        raise APIError(400, f"{field}: {e}", field) from None
    return None


def read_response_format(value) -> dict | None:
    """The JSON schema that `response_format` asks for: None for text, any object for `json_object`."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return ANY_OBJECT
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise APIError(400, "response_format.json_schema.schema must be a JSON schema object", "response_format")
        if spec.get("strict") not in (None, True, False):
            raise APIError(400, "response_format.json_schema.strict must be true or false", "response_format")
        return schema
    raise APIError(400, "response_format must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                        "{\"type\": \"json_schema\", \"json_schema\": {\"name\", \"schema\"}}", "response_format")


def read_tool_choice(body: dict) -> tuple:
    """`tool_choice` as (what, name): (None, None) for "auto" or not given, ("none", None), ("required", None), or
    ("function", the name of the one tool to call)."""
    value, tools = body.get("tool_choice"), body.get("tools")
    if value in (None, "auto", "none"):
        return (None if value == "auto" else value), None
    name = None
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("function"), dict):
        name = value["function"].get("name")
    if value != "required" and not isinstance(name, str):
        raise APIError(400, "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                            "\"function\": {\"name\": ...}}", "tool_choice")
    if not tools:
        raise APIError(400, f"tool_choice {value!r} needs tools to call", "tool_choice")
    names = [t["function"].get("name") for t in tools if isinstance(t.get("function"), dict)]
    if name is not None and name not in names:
        raise APIError(400, f"tool_choice names {name!r}, which is not among the tools ({', '.join(map(str, names))})",
                       "tool_choice")
    return ("required", None) if name is None else ("function", name)
