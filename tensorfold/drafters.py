"""Drafters: cheap guesses of the next tokens, which a lane round then verifies against the model in one pass.

A drafter never changes what is generated: the engine accepts a drafted token only where it equals the token the
model itself samples at that position, so drafting only changes how many tokens one round yields.
"""


class Drafter:
    """The interface: propose up to `max_rows` tokens that may follow `tokens` (the stream's prompt and output)."""

    name = "none"

    def propose(self, tokens: list, max_rows: int) -> list:
        return []


class NgramDrafter(Drafter):
    """Prompt lookup: find the latest earlier occurrence of the stream's last n tokens (n from `longest` down to
    `shortest`; a single token matches too often to be worth verifying) and propose what followed it. Needs no
    weights; pays off on text that repeats its context (code edits, quoting, summaries, structured output)."""

    name = "ngram"

    def __init__(self, longest: int = 3, shortest: int = 2):
        self.longest, self.shortest = longest, shortest

    def propose(self, tokens: list, max_rows: int) -> list:
        if max_rows <= 0:
            return []
        for n in range(min(self.longest, len(tokens) - 1), self.shortest - 1, -1):
            suffix = tokens[-n:]
            for start in range(len(tokens) - n - 1, -1, -1):  # latest match first, never the suffix itself
                if tokens[start:start + n] == suffix:
                    return tokens[start + n:start + n + max_rows]
        return []


def make_drafter(name: str) -> Drafter:
    """A drafter by name: "ngram" or "none"."""
    drafters = {"ngram": NgramDrafter, "none": Drafter}
    if name not in drafters:
        from .errors import TensorfoldError
        raise TensorfoldError(f"unknown drafter {name!r}: choose one of {', '.join(drafters)}")
    return drafters[name]()
