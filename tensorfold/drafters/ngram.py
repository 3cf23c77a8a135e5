"""Prompt lookup: drafts copied from what followed earlier occurrences of the stream's last few tokens."""
from tensorfold.drafters.base import Drafter


class NgramDrafter(Drafter):
    """Prompt lookup: find the latest earlier occurrence of the stream's last n tokens (n from `longest` down to
    `shortest`; a single token matches too often to be worth verifying) and propose what followed it. Needs no
    weights; pays off on text that repeats its context (code edits, quoting, summaries, structured output)."""

    name = "ngram"

    def __init__(self, longest: int = 3, shortest: int = 2, branches: int = 1):
        self.longest, self.shortest, self.branches = longest, shortest, branches

    def continuations(self, tokens: list, max_rows: int):
        """Up to `max_rows` tokens of what followed each earlier occurrence of the stream's last n tokens: the
        longest n first, and for each n the latest occurrence first (never the suffix itself)."""
        if max_rows <= 0:
            return
        for n in range(min(self.longest, len(tokens) - 1), self.shortest - 1, -1):
            suffix = tokens[-n:]
            for start in range(len(tokens) - n - 1, -1, -1):
                if tokens[start:start + n] == suffix:
                    yield tokens[start + n:start + n + max_rows]

    def propose(self, tokens: list, max_rows: int, state=None) -> list:
        return next(self.continuations(tokens, max_rows), [])


class NgramTreeDrafter(NgramDrafter):
    """Prompt lookup with branches: the continuations of the `branches` latest matches (longest n-gram first),
    merged into a tree that shares their common prefixes, so that the round verifies several guesses at once."""

    name = "ngram-tree"

    def __init__(self, longest: int = 3, shortest: int = 2, branches: int = 3):
        super().__init__(longest, shortest, branches)

    def propose_tree(self, tokens: list, max_rows: int, state=None) -> tuple:
        branches = []  # the distinct continuations, in the order `continuations` finds them
        for follow in self.continuations(tokens, max_rows):
            if follow not in branches:
                branches.append(follow)
                if len(branches) == self.branches:
                    break
        ids, parents, node = [], [], {}  # node: (parent index, token) -> index, the trie of the branches
        for follow in branches:
            parent = -1
            for token in follow:
                if (parent, token) not in node:
                    if len(ids) == max_rows:
                        break
                    node[(parent, token)] = len(ids)
                    ids.append(token)
                    parents.append(parent)
                parent = node[(parent, token)]
        return ids, parents
