"""From token ids to what an OpenAI client sees: text deltas cut at stop strings, reasoning split out of the
answer, and Qwen-style XML tool calls parsed into OpenAI `tool_calls`."""
import json
import re
import uuid


def held_back(text: str, markers) -> int:
    """How many trailing characters of `text` could be the start of one of `markers` (so must wait)."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest


class TextOutput:
    """Turns one choice's token ids into text deltas; stops at the first stop string (which is not returned)."""

    def __init__(self, tokenizer, stop: list):
        self.decoder = tokenizer.decoder(skip_special_tokens=True)
        self.stop, self.text, self.sent, self.stopped = stop, "", 0, False

    def _cut(self) -> None:
        for marker in self.stop:
            at = self.text.find(marker)
            if at >= 0:
                self.text, self.stopped = self.text[:at], True

    def push(self, token: int) -> str:
        self.text += self.decoder.push(token)
        self._cut()
        safe = len(self.text) if self.stopped else len(self.text) - held_back(self.text, self.stop)
        delta, self.sent = self.text[self.sent:safe], max(self.sent, safe)
        return delta

    def finish(self) -> str:
        if not self.stopped:
            self.text += self.decoder.flush()
            self._cut()
        delta, self.sent = self.text[self.sent:], len(self.text)
        return delta


class ChatOutput:
    """Splits a chat answer's text into reasoning (up to `</think>`, when the prompt opened a think block),
    content, and tool calls (`<tool_call>` blocks, held back from the content and parsed at the end)."""

    THINK_END, CALL_START = "</think>", "<tool_call>"

    def __init__(self, thinking: bool):
        self.in_reasoning = thinking
        self.after_think = False  # the newlines right after </think> belong to neither part
        self.pending, self.reasoning, self.content, self.calls_text = "", "", "", None

    def push(self, text: str, final: bool = False) -> tuple:
        """Feed text; returns the (reasoning, content) deltas that are safe to send now."""
        self.pending += text
        reasoning = content = ""
        if self.in_reasoning:
            at = self.pending.find(self.THINK_END)
            if at < 0:
                keep = 0 if final else held_back(self.pending, [self.THINK_END])
                reasoning, self.pending = self.pending[:len(self.pending) - keep], self.pending[len(self.pending) - keep:]
                self.reasoning += reasoning
                return reasoning, ""
            reasoning, self.pending = self.pending[:at], self.pending[at + len(self.THINK_END):]
            self.reasoning += reasoning
            self.in_reasoning, self.after_think = False, True
        if self.after_think:
            self.pending = self.pending.lstrip("\n")
            self.after_think = not self.pending
        if self.calls_text is None:
            at = self.pending.find(self.CALL_START)
            if at >= 0:
                content, self.calls_text, self.pending = self.pending[:at], self.pending[at:], ""
            else:
                keep = 0 if final else held_back(self.pending, [self.CALL_START])
                content, self.pending = self.pending[:len(self.pending) - keep], self.pending[len(self.pending) - keep:]
            self.content += content
        else:
            self.calls_text += self.pending
            self.pending = ""
        return reasoning, content

    def tool_calls(self) -> list:
        """The parsed tool calls, in OpenAI's shape (arguments as a JSON string)."""
        return parse_tool_calls(self.calls_text or "")


CALL = re.compile(r"<tool_call>\s*<function=([^>\n]+)>(.*?)</function>\s*(?:</tool_call>|$)", re.DOTALL)
PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


def parse_tool_calls(text: str) -> list:
    calls = []
    for name, body in CALL.findall(text):
        arguments = {}
        for key, value in PARAMETER.findall(body):
            try:
                parsed = json.loads(value)
                arguments[key] = parsed if isinstance(parsed, (dict, list, int, float, bool)) else value
            except ValueError:
                arguments[key] = value  # string values are written raw
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": name.strip(), "arguments": json.dumps(arguments, ensure_ascii=False)}})
    return calls
