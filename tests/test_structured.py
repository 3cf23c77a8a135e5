"""Structured outputs on the embedded model: JSON that follows its schema and tool calls, through the `openai` client
(chat and completions, streamed and not, greedy and seeded, drafted and not), drafted == undrafted under a grammar
with its planted control, and the refusals."""
import concurrent.futures
import json

import numpy as np
import openai
import pytest

import tensorfold
from tensorfold.drafters import Drafter, NgramDrafter
from tensorfold.engine import Engine, SamplingParams
from tensorfold.grammar import Grammar, GrammarError
from tensorfold.models import DEFAULT_MODEL
from tensorfold.prompt_cache import PromptCache
from tensorfold.serve.app import Server

from test_server import Running

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "mood"], "properties": {
    "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "mood": {"enum": ["merry", "sad"]}}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "required": ["city", "unit"], "properties": {
        "city": {"type": "string", "maxLength": 10}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "required": ["zone"],
    "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}}}}}
MOOD = {"type": "function", "function": {"name": "set_mood", "parameters": {
    "type": "object", "required": ["mood"], "properties": {"mood": {"type": "string", "enum": ["merry", "sad"]}}}}}
SAMPLINGS = [dict(temperature=0.0), dict(temperature=0.9, seed=7)]


def follows(value, schema) -> bool:
    """Whether `value` validates against the small JSON schemas of these tests (object, string, integer, enum)."""
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties", {})
        return (isinstance(value, dict) and set(schema.get("required", [])) <= set(value)
                and (schema.get("additionalProperties", True) or set(value) <= set(properties))
                and all(follows(v, properties[k]) for k, v in value.items() if k in properties))
    if kind == "string":
        return isinstance(value, str) and len(value) <= schema.get("maxLength", len(value))
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)
                and schema.get("minimum", value) <= value <= schema.get("maximum", value))
    return True


def test_the_schema_check_of_these_tests_refuses_what_breaks_the_schema():
    assert follows({"name": "Tybalt", "age": 20, "mood": "sad"}, PERSON)
    for wrong in ({"name": "Tybalt", "age": 20}, {"name": "Tybalt", "age": 200, "mood": "sad"},
                  {"name": "Tybalt", "age": 20, "mood": "angry"}, {"name": "x" * 13, "age": 1, "mood": "sad"},
                  {"name": "Tybalt", "age": 20, "mood": "sad", "extra": 1}, [1]):
        assert not follows(wrong, PERSON), wrong


@pytest.fixture(scope="module")
def model():
    return tensorfold.load(DEFAULT_MODEL, backend="numpy")


# --- the grammar ---------------------------------------------------------------------------------------------

def walk(matcher, ids) -> bool:
    """Feed `ids` through the matcher while each is allowed; whether all were."""
    for token in ids:
        if not matcher.allowed()[token]:
            return False
        matcher.advance(token)
    return True


def test_a_schema_allows_its_json_and_then_only_a_stop_id(model):
    tok, vocab = model.tokenizer, model.config.vocab_size
    grammar = Grammar.json(tok, vocab, PERSON)
    matcher = grammar.matcher()
    assert walk(matcher, tok.encode('{"name": "Tybalt", "age": 20, "mood": "sad"}'))
    assert set(np.flatnonzero(matcher.allowed())) == set(tok.stop_ids)
    for wrong in ('{"name": "Tybalt", "age": 20}', '{"name":"Tybalt"', '{"name": "Tybalt", "age": 200'):
        assert not walk(grammar.matcher(), tok.encode(wrong) + [tok.stop_ids[0]]), wrong
    row = np.zeros(vocab, np.float32)
    masked = grammar.matcher().mask(row)
    assert np.isneginf(masked).sum() == vocab - 1 and masked[tok.encode("{")[0]] == 0  # only "{" may start


def test_a_tool_call_grammar_writes_the_templates_xml(model):
    tok, vocab = model.tokenizer, model.config.vocab_size
    call = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nVerona\n</parameter>\n<parameter=unit>\ncelsius"
            "\n</parameter>\n</function>\n</tool_call>")
    assert walk(Grammar.tool_calls(tok, vocab, [WEATHER, TIME]).matcher(), tok.encode(call + "\n" + call))
    assert not walk(Grammar.tool_calls(tok, vocab, [WEATHER, TIME], parallel=False).matcher(),
                    tok.encode(call + "\n" + call))
    assert not walk(Grammar.tool_calls(tok, vocab, [WEATHER, TIME], name="get_time").matcher(), tok.encode(call))
    missing_unit = call.replace("<parameter=unit>\ncelsius\n</parameter>\n", "")
    assert not walk(Grammar.tool_calls(tok, vocab, [WEATHER]).matcher(), tok.encode(missing_unit))
    tool_call = tok.encode("<tool_call>")[0]
    text = Grammar.text(tok, vocab).matcher()
    assert not text.allowed()[tool_call] and walk(text, tok.encode("ROMEO: soft!"))
    thinking = Grammar.json(tok, vocab, {"type": "object"}, reasoning=True).matcher()
    assert walk(thinking, tok.encode("Let me think.</think>\n\n{}"))


@pytest.mark.parametrize("schema, reason", [({"type": "strin"}, "strin"),
                                            ({"type": "object", "dependentRequired": {"a": ["b"]}},
                                             "dependentRequired"),
                                            ([1], "must be a JSON object")])
def test_a_schema_the_library_refuses_names_the_problem(model, schema, reason):
    with pytest.raises(GrammarError, match=reason):
        Grammar.json(model.tokenizer, model.config.vocab_size, schema)


# --- drafted == undrafted --------------------------------------------------------------------------------------

class Oracle(Drafter):
    """Proposes the known undrafted output, every fourth guess wrong, as a chain or as a tree with a wrong sibling
    at each level: drafts get accepted in full, in part and not at all."""

    def __init__(self, prompt, output, tree=False):
        self.prompt, self.output, self.tree = prompt, output, tree

    def propose_tree(self, tokens, max_rows, state=None):
        done = len(tokens) - len(self.prompt)
        chain = [t if (done + i) % 4 else (t + 1) % 4000
                 for i, t in enumerate(self.output[done:done + (max_rows // 2 if self.tree else max_rows)])]
        if not self.tree:
            return chain, list(range(-1, len(chain) - 1))
        ids, parents = [], []
        for depth, token in enumerate(chain):
            parents += [2 * depth - 1 if depth else -1] * 2
            ids += [(token + 7) % 4000, token]
        return ids, parents


class MaskSkipsDraftedRows(Engine):
    """Control: the rows after a window's first are drawn without the grammar's mask."""

    def _draws(self, streams, windows, logits, starts, planned=None):
        draws = super()._draws(streams, windows, logits, starts, planned)
        return [None if draw is None else self._unmasked_after_first(draw, stream.request)
                for draw, stream in zip(draws, streams)]

    @staticmethod
    def _unmasked_after_first(draw, request):
        def at(row):
            if row <= 0 or request.matcher is None:  # -1: a prompt chunk's last row
                return draw(row)
            matcher, request.matcher = request.matcher, None
            try:
                token = draw(row)
            finally:
                request.matcher = matcher
            matcher.advance(token)
            return token
        return at


def constrained(model, engine_class, drafter, prompt, grammar, sampling):
    engine = engine_class(model, parallel=2, drafter=drafter)
    request = engine.submit(prompt, SamplingParams(max_tokens=40, grammar=grammar, **sampling))
    while engine.run_round():
        pass
    return request


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_drafted_equals_undrafted_under_a_grammar_and_a_mask_that_skips_drafted_rows_is_caught(model, sampling):
    tok, vocab = model.tokenizer, model.config.vocab_size
    prompt = tok.apply_chat_template([{"role": "user", "content": "Who are you?"}], tokenize=True)
    grammar = Grammar.json(tok, vocab, PERSON)
    undrafted = constrained(model, Engine, Drafter(), prompt, grammar, sampling)
    assert undrafted.finish_reason == "stop" and follows(json.loads(tok.decode(undrafted.output)), PERSON)
    for tree in (False, True):
        drafted = constrained(model, Engine, Oracle(prompt, undrafted.output, tree), prompt, grammar, sampling)
        assert (drafted.output, drafted.finish_reason) == (undrafted.output, "stop"), tree
        assert 0 < drafted.stats.accepted < drafted.stats.drafted
    control = constrained(model, MaskSkipsDraftedRows, Oracle(prompt, undrafted.output), prompt, grammar, sampling)
    assert control.stats.accepted > 0  # it reached drafted rows
    assert (control.output, control.finish_reason) != (undrafted.output, "stop")


# --- through the openai client ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def served(model):
    engine = Engine(model, parallel=16, context=1024, drafter=NgramDrafter(), max_draft=4, chunk=32,
                    prompt_cache=PromptCache(64 << 20, 32))  # the tools' long system turn runs once
    running = Running(Server(engine, "tiny-shakespeare"))
    yield running
    running.stop()


def ask(client, chat, stream, extra, **fields):
    """(text, finish_reason, token_sha256, tool_calls) of one request."""
    if chat:
        call = dict(model="tiny-shakespeare", messages=[{"role": "user", "content": "Name a person, as JSON."}],
                    stream=stream, extra_body=extra, **fields)
        if not stream:
            choice = client.chat.completions.create(**call).choices[0]
            calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
            return choice.message.content, choice.finish_reason, choice.model_extra["token_sha256"], calls
        text, calls, last = "", [], None
        for chunk in client.chat.completions.create(**call):
            delta = chunk.choices[0].delta
            text += delta.content or ""
            calls += [(c.function.name, c.function.arguments) for c in delta.tool_calls or []]
            last = chunk.choices[0]
        return text, last.finish_reason, last.model_extra["token_sha256"], calls
    extra = {**extra, **{k: fields.pop(k) for k in ("response_format",) if k in fields}}
    call = dict(model="tiny-shakespeare", prompt="ROMEO:\n", stream=stream, extra_body=extra, **fields)
    if not stream:
        choice = client.completions.create(**call).choices[0]
        return choice.text, choice.finish_reason, choice.model_extra["token_sha256"], []
    text, last = "", None
    for chunk in client.completions.create(**call):
        text += chunk.choices[0].text
        last = chunk.choices[0]
    return text, last.finish_reason, last.model_extra["token_sha256"], []


EVERY_WAY = [(chat, stream, s, draft) for chat in (True, False) for stream in (False, True) for s in (0, 1)
             for draft in (True, False)]  # (chat, stream, sampling, draft)


def every_way(served, cases, max_tokens, **fields) -> dict:
    """The same request in each way of `cases` (as EVERY_WAY's), sent at once: {case: answer}."""
    client = served.client()
    with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
        futures = {case: pool.submit(ask, client, case[0], case[1], {"draft": case[3]}, max_tokens=max_tokens,
                                     **SAMPLINGS[case[2]], **fields) for case in cases}
        return {case: future.result() for case, future in futures.items()}


def test_json_schema_answers_parse_and_validate_every_way(served):
    answers = every_way(served, EVERY_WAY, 48, response_format={"type": "json_schema", "json_schema": {
        "name": "person", "schema": PERSON, "strict": True}})
    for (chat, stream, s, draft), (text, finish, sha, _) in answers.items():
        assert finish == "stop" and follows(json.loads(text), PERSON), (chat, stream, s, draft, text)
        assert sha == answers[(chat, False, s, False)][2]  # drafted == undrafted, streamed == not


def test_json_object_answers_parse_or_are_cut_short_by_length(served, model):
    ways = [(True, False, 0, True), (True, True, 1, False), (False, False, 1, False), (False, True, 0, True)]
    for text, finish, _, _ in every_way(served, ways, 12, response_format={"type": "json_object"}).values():
        if finish == "stop":
            assert isinstance(json.loads(text), dict), text
        else:  # max_tokens came first: a beginning of an object that the grammar still allows
            assert finish == "length" and walk(Grammar.json(model.tokenizer, model.config.vocab_size,
                                                            {"type": "object"}).matcher(), model.tokenizer.encode(text))
    stops = [ask(served.client(), True, False, {}, max_tokens=8, temperature=3.0, seed=seed,
                 response_format={"type": "json_object"}) for seed in range(1, 4)]
    assert all(finish == "length" or isinstance(json.loads(text), dict) for text, finish, _, _ in stops)
    assert "stop" in {finish for _, finish, _, _ in stops}


def test_tool_choice_required_and_named_give_a_parseable_call(served):
    client = served.client()
    named = {"type": "function", "function": {"name": "get_time"}}
    cases = [("required", False, 0), ("required", True, 1), (named, False, 1), (named, True, 0)]
    ask(client, True, False, {}, max_tokens=1, tools=[MOOD, TIME])  # stores the prompt's marks for the others
    with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
        futures = [pool.submit(ask, client, True, stream, {}, max_tokens=48, tools=[MOOD, TIME], tool_choice=choice,
                               parallel_tool_calls=False, **SAMPLINGS[s]) for choice, stream, s in cases]
        answers = [future.result() for future in futures]
    for (choice, stream, s), (text, finish, _, calls) in zip(cases, answers):
        assert finish == "tool_calls" and len(calls) == 1 and not text, (choice, stream, s, text, finish, calls)
        name, arguments = calls[0]
        tool = {"set_mood": MOOD, "get_time": TIME}[name]
        assert follows(json.loads(arguments), tool["function"]["parameters"]), arguments
        assert choice == "required" or name == "get_time"


@pytest.mark.parametrize("fields, param, words", [
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "dependentRequired": {"a": ["b"]}}}}), "response_format", "dependentRequired"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}),
     "response_format", "strin"),
    (dict(response_format={"type": "yaml"}), "response_format", "json_schema"),
    (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_time"}}), "tool_choice",
     "get_time"),
    (dict(tool_choice="required"), "tool_choice", "needs tools"),
    (dict(tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"}), "response_format",
     "choose one"),
    (dict(tools=[WEATHER], tool_choice="required", parallel_tool_calls="yes"), "parallel_tool_calls", "true or"),
])
def test_refusals_name_the_field(served, fields, param, words):
    client = served.client()
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny-shakespeare", messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=4, **fields)
    error = caught.value.body
    assert error["param"] == param and words in error["message"], error
    assert ask(client, True, False, {}, max_tokens=2)[1] == "length"  # and the server serves on
