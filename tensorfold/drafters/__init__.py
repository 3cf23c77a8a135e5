"""Drafters: cheap guesses of the next tokens, which a lane round then verifies against the model in one pass.

A drafter never changes what is generated: the engine accepts a drafted token only where it equals the token the
model itself samples at that position, so drafting only changes how many tokens one round yields.

* base.py: the interface (`Drafter`, which proposes nothing).
* ngram.py: prompt lookup, in chains (`NgramDrafter`) or trees (`NgramTreeDrafter`).
* block.py: the DFlash block drafter, a small model that reads the target's hidden states.
* replay.py: the block drafter's proposals and extends replayed from CUDA graphs.
* gate.py: "auto"'s rule for when a round drafts, measured as the engine runs (`DraftGate`).
"""
import os

from tensorfold.drafters.base import Drafter
from tensorfold.drafters.gate import DraftGate
from tensorfold.drafters.ngram import NgramDrafter, NgramTreeDrafter
from tensorfold.errors import TensorfoldError

__all__ = ["NAMED", "DraftGate", "Drafter", "NgramDrafter", "NgramTreeDrafter", "auto_drafter", "make_drafter"]

NAMED = ("auto", "ngram", "ngram-tree", "none")


def make_drafter(name: str, model=None, shape: str = "chain", rows: int | None = None) -> Drafter:
    """A drafter by name: "ngram" (chains), "ngram-tree", "none", a DFlash block drafter checkpoint folder (for
    `model`, drafting trees or chains of up to `rows` rows with the root, by default its block size), or "auto"
    (`auto_drafter`)."""
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
    """What "auto" stands for with `model`: the model's own block drafter when its folder has one (`drafter/`
    beside the weights), else "ngram"; "none" without a model. The engine that runs it should take a `DraftGate`
    (gate.py), which lets a round draft only while drafted rounds give more tokens a second than undrafted ones:
    whether drafting pays depends on the backend, the model and the text, so it is measured as the engine runs
    (docs/drafting.rst, "auto")."""
    if model is None:
        return "none"
    own = os.path.join(model.path, "drafter")
    return own if os.path.isfile(os.path.join(own, "config.json")) else "ngram"
