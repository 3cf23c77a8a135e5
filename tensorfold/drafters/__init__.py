"""Drafters: cheap guesses of the next tokens, which a lane round then verifies against the model in one pass.

A drafter never changes what is generated: the engine accepts a drafted token only where it equals the token the
model itself samples at that position, so drafting only changes how many tokens one round yields.
"""
import os


class Drafter:
    """The interface: propose up to `max_rows` tokens that may follow `tokens` (the stream's prompt and output; its
    last token is the one sampled last, not yet run through the model).

    A drafter that reads the model's hidden states (the block drafter) names the layers it needs in `taps`; the
    engine then gives it, for every stream, a state of its own (`new_stream`) and, after each round, the outputs of
    those layers at the rows the stream committed (`observe`). Drafters that read only tokens ignore both."""

    name = "none"
    taps: tuple = ()  # target layers whose outputs (the residual stream after the layer) the drafter reads

    def new_stream(self):
        """Per-stream drafter state, handed back to `observe` and the proposals."""
        return None

    def observe(self, state, features: list, position: int) -> None:
        """Rows the stream committed: `features[j]` holds layer taps[j]'s output [rows, hidden] at positions
        position, position + 1, ..."""

    def save(self, state):
        """A host copy of a stream's state, kept with a prompt-cache snapshot: None (nothing to keep), or an object
        whose `nbytes` the cache counts against its budget."""
        return None

    def restore(self, saved):
        """A stream state from what `save` returned."""
        return self.new_stream()

    def stream_bytes(self, rows: int) -> int:
        """Memory a stream's state takes when the stream holds `rows` rows."""
        return 0

    def propose(self, tokens: list, max_rows: int, state=None) -> list:
        """A chain of guesses."""
        return []

    def propose_tree(self, tokens: list, max_rows: int, state=None) -> tuple:
        """A tree of up to `max_rows` guesses: (tokens, parents), where parents[i] is the index of the guess that
        guess i follows, or -1 for the stream's next token itself. The default is the chain `propose` gives."""
        chain = self.propose(tokens, max_rows, state)
        return chain, list(range(-1, len(chain) - 1))


class NgramDrafter(Drafter):
    """Prompt lookup: find the latest earlier occurrence of the stream's last n tokens (n from `longest` down to
    `shortest`; a single token matches too often to be worth verifying) and propose what followed it. Needs no
    weights; pays off on text that repeats its context (code edits, quoting, summaries, structured output)."""

    name = "ngram"

    def __init__(self, longest: int = 3, shortest: int = 2, branches: int = 1):
        self.longest, self.shortest, self.branches = longest, shortest, branches

    def propose(self, tokens: list, max_rows: int, state=None) -> list:
        if max_rows <= 0:
            return []
        for n in range(min(self.longest, len(tokens) - 1), self.shortest - 1, -1):
            suffix = tokens[-n:]
            for start in range(len(tokens) - n - 1, -1, -1):  # latest match first, never the suffix itself
                if tokens[start:start + n] == suffix:
                    return tokens[start + n:start + n + max_rows]
        return []


NAMED = ("auto", "ngram", "ngram-tree", "none")


def make_drafter(name: str, model=None, shape: str = "chain", rows: int | None = None) -> Drafter:
    """A drafter by name: "ngram" (chains), "ngram-tree", "none", a DFlash block drafter checkpoint folder (for
    `model`, drafting trees or chains of up to `rows` rows with the root, by default its block size), or "auto"
    (`auto_drafter`)."""
    from tensorfold.errors import TensorfoldError
    if name == "auto":
        name = auto_drafter(model)
    drafters = {"ngram": NgramDrafter, "ngram-tree": NgramTreeDrafter, "none": Drafter}
    if name in drafters:
        return drafters[name]()
    if not os.path.isdir(name):
        raise TensorfoldError(f"unknown drafter {name!r}: choose one of {', '.join(NAMED)} or give the folder of a "
                              "DFlash block drafter checkpoint")
    if model is None:
        raise TensorfoldError("a block drafter needs the model it drafts for")
    from tensorfold.drafters.block import load_drafter
    return load_drafter(name, model, shape=shape, rows=rows)


def auto_drafter(model) -> str:
    """What "auto" stands for with `model`: a drafter only where a drafted round is cheap enough to repay itself
    (docs/performance.rst, "Drafting", measures each case).

    * On a GPU with CUDA graphs off (TENSORFOLD_GRAPHS=0) every round runs eagerly, a launch at a time, and costs
      about as much with 16 rows as with one: the model's own block drafter when its folder has one (`drafter/`
      beside the weights), else "ngram".
    * On a GPU with graphs on (the default there), "none": undrafted decode rounds replay from a recording, while a
      drafted round is not a decode round and still runs eagerly (undrafted decode was 2.9 to 32 times faster).
    * On the numpy backend, "none": a round costs in proportion to its rows, so the rows a draft adds cost more than
      the tokens they save (undrafted decode was 1.3 to 1.7 times faster than n-gram chains)."""
    from tensorfold.model.replay import replays_decode_rounds
    if model is None or model.backend.name != "cuda" or replays_decode_rounds(model.backend):
        return "none"
    own = os.path.join(model.path, "drafter")
    return own if os.path.isfile(os.path.join(own, "config.json")) else "ngram"


class NgramTreeDrafter(NgramDrafter):
    """Prompt lookup with branches: the continuations of the `branches` latest matches (longest n-gram first),
    merged into a tree that shares their common prefixes, so that the round verifies several guesses at once."""

    name = "ngram-tree"

    def __init__(self, longest: int = 3, shortest: int = 2, branches: int = 3):
        super().__init__(longest, shortest, branches)

    def continuations(self, tokens: list, max_rows: int) -> list:
        found, seen = [], set()
        for n in range(min(self.longest, len(tokens) - 1), self.shortest - 1, -1):
            suffix = tokens[-n:]
            for start in range(len(tokens) - n - 1, -1, -1):
                if tokens[start:start + n] == suffix:
                    follow = tuple(tokens[start + n:start + n + max_rows])
                    if follow and follow not in seen:
                        seen.add(follow)
                        found.append(follow)
                        if len(found) == self.branches:
                            return found
        return found

    def propose_tree(self, tokens: list, max_rows: int, state=None) -> tuple:
        ids, parents, node = [], [], {}  # node: (parent index, token) -> index, the trie of the continuations
        for follow in self.continuations(tokens, max_rows):
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
