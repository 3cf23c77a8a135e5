"""The checkpoint shipped inside the package: the model every command uses when no `--model` is given."""
import os

from tensorfold.errors import TensorfoldError

DEFAULT_MODEL = os.path.join(os.path.dirname(__file__), "tiny-shakespeare")


def default_model() -> str:
    """The embedded checkpoint's folder (a 7.9M-parameter Qwen3.5 trained on Shakespeare, MLX 4-bit)."""
    if not os.path.exists(os.path.join(DEFAULT_MODEL, "config.json")):
        raise TensorfoldError("no --model given and this installation has no embedded default model")
    return DEFAULT_MODEL
