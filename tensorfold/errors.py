"""The error types tensorfold raises for bad input.

Every message names the thing that is wrong (a config field, a tensor, a request parameter) and its value, so
that a user can fix the input without reading the source.
"""


class TensorfoldError(Exception):
    """Base class of every error tensorfold raises on purpose."""


class ConfigError(TensorfoldError, ValueError):
    """A model config that tensorfold cannot run: a missing or invalid field, an unsupported model type."""


class CheckpointError(TensorfoldError, ValueError):
    """A checkpoint whose files or tensors do not match its config: missing, extra, misshaped or truncated."""


class BackendError(TensorfoldError, RuntimeError):
    """A backend that cannot run here, such as `cuda` on a machine without a usable GPU."""
