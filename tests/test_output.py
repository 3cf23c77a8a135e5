"""Turning generated text into what clients see: stop strings, reasoning, tool calls."""
import json

from tensorfold.serve.output import ChatOutput, held_back, parse_tool_calls


def feed(output: ChatOutput, text: str, step: int = 3):
    """Feed `text` in small pieces, as tokens arrive; returns the concatenated (reasoning, content) deltas."""
    reasoning = content = ""
    for i in range(0, len(text), step):
        r, c = output.push(text[i:i + step])
        reasoning, content = reasoning + r, content + c
    r, c = output.push("", final=True)
    return reasoning + r, content + c


def test_held_back():
    assert held_back("hello </thi", ["</think>"]) == 5
    assert held_back("hello", ["</think>"]) == 0
    assert held_back("ab<", ["<tool_call>", "<|x|>"]) == 1


def test_reasoning_is_split_at_think_end_in_any_piece_size():
    text = "Let me think about it.\nYes.</think>\n\nThe answer is 4."
    for step in (1, 2, 5, 100):
        out = ChatOutput(thinking=True)
        assert feed(out, text, step) == ("Let me think about it.\nYes.", "The answer is 4.")
    assert feed(ChatOutput(thinking=False), text) == ("", text)  # no think block in the prompt: all content


def test_tool_calls_are_parsed_and_held_out_of_the_content():
    text = ("I will look it up.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nVerona\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n<parameter=units>\n{\"t\": \"C\"}\n</parameter>\n</function>\n"
            "</tool_call>")
    for step in (1, 4, 1000):
        out = ChatOutput(thinking=False)
        reasoning, content = feed(out, text, step)
        assert content == "I will look it up.\n"
        calls = out.tool_calls()
        assert [c["function"]["name"] for c in calls] == ["get_weather"]
        assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Verona", "days": 3, "units": {"t": "C"}}
    assert parse_tool_calls("no calls here") == []
