"""The drafter interface, and the drafter that proposes nothing."""


class Drafter:
    """The interface: propose up to `max_rows` tokens that may follow `tokens` (the stream's prompt and output; its
    last token is the one sampled last, not yet run through the model).

    A drafter that reads the model's hidden states (the block drafter) names the layers it needs in `taps`; the
    engine then gives it, for every stream, a state of its own (`new_stream`, or its lane's last one `reset`) and,
    after each round, the outputs of those layers at the rows the stream committed (`observe`). Drafters that read
    only tokens ignore both."""

    name = "none"
    taps: tuple = ()  # target layers whose outputs (the residual stream after the layer) the drafter reads
    recordings = 0  # CUDA graphs it has recorded so far (the block drafter's replayed proposals and extends)
    window_rows = None  # the most rows of a window it fills, the decode row included (None: no bound of its own)

    @property
    def proposes(self) -> bool:
        """Whether it ever proposes a guess: a drafter that overrides `propose` or `propose_tree` does."""
        return type(self).propose is not Drafter.propose or type(self).propose_tree is not Drafter.propose_tree

    def new_stream(self):
        """Per-stream drafter state, handed back to `observe` and the proposals (none here)."""

    def reset(self, state):
        """A state of an ended request emptied for the next request of its lane, in place where it holds device
        buffers (so that recordings made on them replay); here a new one."""
        return self.new_stream()

    def observe(self, state, features: list, position: int, kept: list | None = None) -> None:
        """Rows the stream committed, at positions position, position + 1, ...: `features[j]` holds layer taps[j]'s
        output [n, hidden] at a window's n rows (the window's own arrays, passed whole), of which the rows `kept`
        were committed, in that order (a chain's first rows, or a tree's path; all n by default)."""

    def save(self, state):
        """A host copy of a stream's state, kept with a prompt-cache snapshot: None (nothing to keep, as here), or an
        object whose `nbytes` the cache counts against its budget."""

    def restore(self, saved, into=None):
        """A stream state from what `save` returned; `into`: a lane's last state, to hold it where it can."""
        return self.new_stream() if into is None else self.reset(into)

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
