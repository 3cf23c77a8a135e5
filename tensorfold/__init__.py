"""tensorfold: a pure-Python inference engine for Qwen3.5 hybrid models, whose NumPy twins and numba-cuda kernels
compute the same bits.

The public API (stable): `load`, `Model` (`logits`, `generate`, `stream`, `tokenizer`), and the error types.
`load` and `Model` are imported on first use, so that a command can still choose numba's CUDA simulator
(`NUMBA_ENABLE_CUDASIM`, read when numba.cuda is first imported) after importing the package.
"""
from tensorfold.errors import BackendError, CheckpointError, ConfigError, TensorfoldError

__all__ = ["BackendError", "CheckpointError", "ConfigError", "Model", "TensorfoldError", "load"]
__version__ = "0.1.0"


def __getattr__(name):
    if name in ("load", "Model"):
        from tensorfold import api
        return getattr(api, name)
    raise AttributeError(f"module 'tensorfold' has no attribute {name!r}")
