"""Tokenizer, chat template and stream decoder, on a BPE trained from the built-in tiny corpus."""

import json
import re
import shutil

import jinja2
import pytest

from tensorfold.errors import CheckpointError
from tensorfold.model.tiny_corpus import TINY_CORPUS
from tensorfold.model.tokenizer import Tokenizer, train_bpe_tokenizer

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city, in °C",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokenizer")
    train_bpe_tokenizer([TINY_CORPUS], 400, path)
    return path


@pytest.fixture(scope="module")
def tok(folder):
    return Tokenizer.from_folder(folder)


def only_tokenizer_json(folder, tmp_path):
    """A folder holding just the trained tokenizer.json, to add other files to."""
    shutil.copy(folder / "tokenizer.json", tmp_path / "tokenizer.json")
    return tmp_path


@pytest.mark.parametrize("text", ["Shall I compare thee to a summer's day?\n  x = 42",
                                  "café naïve Übermut Москва 東京", "thumbs up 👍🏽 and a smile 🙂"])
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_special_and_added_tokens(tok):
    assert [tok.encode(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [[0], [1], [2]]
    assert tok.encode("<|im_start|>user")[0] == 1
    think = tok.encode("<think>")
    assert len(think) == 1 and think[0] >= 3
    ids = tok.encode("<|im_start|>assistant\n<think>\nhm\n</think>\n\nHi<|im_end|>")
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<think>\nhm\n</think>\n\nHi"


def test_training_is_deterministic(folder, tmp_path):
    train_bpe_tokenizer([TINY_CORPUS], 400, tmp_path)
    assert (tmp_path / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()


def test_written_configs(folder, tok):
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["chat_template"] == (folder / "chat_template.jinja").read_text() == tok.chat_template
    assert (config["eos_token"], config["pad_token"]) == ("<|im_end|>", "<|endoftext|>")
    assert json.loads((folder / "generation_config.json").read_text()) == {"eos_token_id": [2, 0], "pad_token_id": 0}
    assert tok.stop_ids == (2, 0)


def test_plain_conversation(tok):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2 + 2?"}]
    assert tok.apply_chat_template(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n"
        "<|im_start|>user\n2 + 2?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tok.apply_chat_template(messages, tokenize=True) == tok.encode(tok.apply_chat_template(messages))


def test_thinking_switch(tok):
    messages = [{"role": "user", "content": "Hi"}]
    assert tok.apply_chat_template(messages, enable_thinking=True).endswith("<|im_start|>assistant\n<think>\n")
    off = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert tok.apply_chat_template(messages, enable_thinking=False).endswith(off)
    assert tok.apply_chat_template(messages, add_generation_prompt=False) == "<|im_start|>user\nHi<|im_end|>\n"


def test_system_only_first(tok):
    messages = [{"role": "user", "content": "Hi"}, {"role": "system", "content": "Be brief."}]
    with pytest.raises(jinja2.TemplateError, match="system message"):
        tok.apply_chat_template(messages)


def test_reasoning_kept_only_after_last_query(tok):
    messages = [{"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello.", "reasoning_content": "A greeting."},
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "<think>\nNeed a tool.\n</think>\n\nOne moment."}]
    assert tok.apply_chat_template(messages, add_generation_prompt=False) == (
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n"
        "<|im_start|>user\nWeather?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nNeed a tool.\n</think>\n\nOne moment.<|im_end|>\n")


def test_tools_section(tok):
    text = tok.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                                   tools=[WEATHER_TOOL])
    system = text[:text.index("<|im_end|>")]
    assert system.startswith("<|im_start|>system\n# Tools\n\n")
    assert "<tools>\n" + json.dumps(WEATHER_TOOL, ensure_ascii=False) + "\n</tools>" in system
    assert "<function=function_name>\n<parameter=parameter_name>" in system
    assert system.endswith("\n\nBe brief.")


def test_tool_calls_and_grouped_responses(tok):
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}}
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [call, call]},
                {"role": "tool", "content": "18"}, {"role": "tool", "content": "20"}]
    text = tok.apply_chat_template(messages, tools=[WEATHER_TOOL], add_generation_prompt=False)
    xml = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n" \
          "<parameter=days>\n[1, 2]\n</parameter>\n</function>\n</tool_call>"
    assert text.endswith(
        f"<|im_start|>assistant\n<think>\n\n</think>\n\nChecking.\n\n{xml}\n{xml}<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n18\n</tool_response>\n<tool_response>\n20\n</tool_response><|im_end|>\n")


@pytest.mark.parametrize("form", ["string", "list"])
def test_template_from_tokenizer_config(folder, tmp_path, form):
    path = only_tokenizer_json(folder, tmp_path)
    template = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    value = template if form == "string" else [{"name": "tool_use", "template": "no"},
                                               {"name": "default", "template": template}]
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": value}))
    tok = Tokenizer.from_folder(path)
    assert tok.apply_chat_template([{"role": "user", "content": "Hi"}]) == "[user]Hi"


def test_no_chat_template(folder, tmp_path):
    tok = Tokenizer.from_folder(only_tokenizer_json(folder, tmp_path))
    with pytest.raises(CheckpointError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "Hi"}])


def test_missing_tokenizer_json(tmp_path):
    with pytest.raises(CheckpointError, match=re.escape(str(tmp_path / "tokenizer.json"))):
        Tokenizer.from_folder(tmp_path)


def test_stop_ids_merge(folder, tmp_path):
    path = only_tokenizer_json(folder, tmp_path)
    assert Tokenizer.from_folder(path, eos_token_ids=[2]).stop_ids == (2,)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 2, 5]}))
    assert Tokenizer.from_folder(path, eos_token_ids=[2]).stop_ids == (2, 0, 5)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 0}))
    assert Tokenizer.from_folder(path, eos_token_ids=(2, 0)).stop_ids == (2, 0)


def test_stream_decoder(tok):
    text = "Mädchen in 東京 say 👍🏽: «naïve» café!\n<think>ok</think>"
    ids = tok.encode(text)
    assert any(tok.decode([i]) == "\ufffd" for i in ids)  # some characters are split across tokens
    stream = tok.decoder()
    pieces = [stream.push(i) for i in ids]
    pieces.append(stream.flush())
    assert not any("\ufffd" in piece for piece in pieces)
    assert "".join(pieces) == tok.decode(ids) == text


def test_matches_transformers(folder, tok):
    from transformers import PreTrainedTokenizerFast

    reference = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    messages = [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Weather in Zürich?"},
                {"role": "assistant", "content": "", "reasoning_content": "Use the tool.", "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
                {"role": "tool", "content": "{\"temp\": 18}"}]
    for thinking in (False, True):
        expected = reference.apply_chat_template(messages, tools=[WEATHER_TOOL], chat_template=tok.chat_template,
                                                 add_generation_prompt=True, tokenize=False, enable_thinking=thinking)
        assert tok.apply_chat_template(messages, tools=[WEATHER_TOOL], enable_thinking=thinking) == expected
        assert reference.encode(expected, add_special_tokens=False) == tok.encode(expected)
