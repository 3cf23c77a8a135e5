"""Long-lived objects out of the garbage collector's scans.

A model on the device holds a Python object for each device array of its weights, and its rounds add compiled
kernels and recordings: for the 2B, well over a hundred thousand objects that the collector tracks, made once and
kept until the process ends. CPython's full collection (its oldest generation) walks every tracked object, and it
runs whenever the objects that outlived the younger collections have grown by a quarter, which a process making
device arrays every round reaches every few hundred rounds. On a GPU each such collection pauses the process for
hundreds of milliseconds (docs/performance.rst, "The collector"), the time of a hundred one-row rounds, in whatever
round it lands. `settle` collects once, then freezes what survived (`gc.freeze`): later collections walk only what
was made after it. Frozen objects are still freed when nothing refers to them; only a reference cycle among them
would stay, which is why the engine settles only after a round that made long-lived objects (a recording).
"""
import gc


def settle() -> None:
    """Collect the garbage there is now, then leave every object that survives out of later collections."""
    gc.collect()
    gc.freeze()
