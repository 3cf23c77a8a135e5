"""Drafters: cheap guesses of the next tokens, which a lane round then verifies against the model in one pass.

A drafter never changes what is generated: the engine accepts a drafted token only where it equals the token the
model itself samples at that position, so drafting only changes how many tokens one round yields.

* base.py: the interface (`Drafter`, which proposes nothing).
* ngram.py: prompt lookup, in chains (`NgramDrafter`) or trees (`NgramTreeDrafter`).
* block.py: the DFlash block drafter, a small model that reads the target's hidden states.
* replay.py: the block drafter's proposals and extends replayed from CUDA graphs.
"""
import os

from tensorfold.drafters.base import Drafter
from tensorfold.drafters.ngram import NgramDrafter, NgramTreeDrafter
from tensorfold.errors import TensorfoldError

__all__ = ["NAMED", "Drafter", "NgramDrafter", "NgramTreeDrafter", "auto_drafter", "make_drafter"]

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
    """What "auto" stands for with `model`: a drafter only where a drafted round is cheap enough to repay itself
    (docs/performance.rst, "Drafting", measures each case).

    * On a GPU with CUDA graphs off (TENSORFOLD_GRAPHS=0) every round runs eagerly, a launch at a time, and costs
      about as much with 16 rows as with one: the model's own block drafter when its folder has one (`drafter/`
      beside the weights), else "ngram".
    * On a GPU with graphs on (the default there), "none": drafted rounds replay too, and so do the block
      drafter's proposal and extend (drafters/replay.py), but the keep after the walk still runs eagerly and a
      window shape not seen before costs a recording; measured before the drafter replayed, a drafted round cost
      more than the tokens it added.
    * On the numpy backend, which cannot record, "none": a round costs in proportion to its rows, so the rows a
      draft adds cost more than the tokens they save."""
    from tensorfold.model.replay import replays_decode_rounds
    if model is None or not model.backend.can_record or replays_decode_rounds(model.backend):
        return "none"
    own = os.path.join(model.path, "drafter")
    return own if os.path.isfile(os.path.join(own, "config.json")) else "ngram"

