"""tensorfold: a pure-Python inference engine for Qwen3.5 hybrid models, whose NumPy twins and numba-cuda kernels
compute the same bits.

The public API (stable): `load`, `Model` (`logits`, `generate`, `stream`, `tokenizer`), and the error types.
"""
from .api import Model, load
from .errors import BackendError, CheckpointError, ConfigError, TensorfoldError

__all__ = ["load", "Model", "TensorfoldError", "ConfigError", "CheckpointError", "BackendError"]
__version__ = "0.1.0"
