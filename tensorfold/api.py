"""The public API: `tensorfold.load(model=None, backend="auto") -> Model`.

    >>> import tensorfold
    >>> model = tensorfold.load("path/to/checkpoint")          # a folder or a hub id; load() is the embedded model
    >>> ids = model.tokenizer.encode("ROMEO:")
    >>> model.logits(ids).shape                                 # every position of one prompt pass
    (2, 4096)
    >>> model.tokenizer.decode(model.generate(ids, max_tokens=20))
"""
import os

import numpy as np

from tensorfold.backends import make_backend
from tensorfold.engine import Engine, SamplingParams
from tensorfold.model.checkpoint import load_weights, resolve
from tensorfold.model.config import ModelConfig
from tensorfold.model.qwen35 import Qwen35
from tensorfold.model.tokenizer import Tokenizer
from tensorfold.models import default_model
from tensorfold.request import PROMPT_CHUNK, check_prompt


class Model:
    """A loaded checkpoint: its config, tokenizer and forward pass on one backend."""

    def __init__(self, path: str, config: ModelConfig, weights: dict, tokenizer: Tokenizer, backend):
        self.path, self.config, self.tokenizer, self.backend = path, config, tokenizer, backend
        self.net = Qwen35(config, weights, backend)

    @property
    def weight_bytes(self) -> int:
        """Bytes the weights take in memory (4-bit weights stay packed)."""
        return sum(getattr(w, "nbytes", 0) for w in self.net.weights.values())

    def prefill(self, ids, state, logits_for="last"):
        """Run a prompt through `state` in chunks of PROMPT_CHUNK rows: the last row's logits (on the backend), or
        all rows' logits (on the host)."""
        chunks = [self.net.forward(ids[i:i + PROMPT_CHUNK], state, logits_for)
                  for i in range(0, len(ids), PROMPT_CHUNK)]
        return np.concatenate([self.backend.to_host(c) for c in chunks]) if logits_for == "all" else chunks[-1]

    def logits(self, ids) -> np.ndarray:
        """float32 [len(ids), vocab_size]: the logits at every position of one prompt pass from a fresh state."""
        ids = check_prompt(ids, self.config.vocab_size)
        return self.prefill(ids, self.net.new_state(), "all")

    def stream(self, ids, max_tokens, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, seed=None, stop_ids=None):
        """Yield generated token ids one by one; stops after `max_tokens` or at a stop id (not yielded).

        `stop_ids=None` uses the checkpoint's own (config and generation_config); pass `()` to ignore them. The
        draw for output position n depends only on (seed, n); `seed=None` picks a random seed. The request runs as
        the one stream of an undrafted `Engine` on this thread, so it is checked (`SamplingParams.problems`) and
        sampled as every engine and server request is.
        """
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                min_p=min_p, seed=seed, stop_ids=None if stop_ids is None else tuple(stop_ids),
                                draft=False)
        params.check()  # before max_tokens sizes the stream
        ids = list(ids)
        engine = Engine(self, parallel=1, chunk=PROMPT_CHUNK,
                        context=min(len(ids) + max_tokens, self.config.max_position_embeddings))
        request = engine.submit(ids, params)
        yielded = 0
        while request.finish_reason is None:
            engine.run_round()
            yield from request.output[yielded:]
            yielded = len(request.output)
        if request.error is not None:
            raise request.error

    def generate(self, ids, max_tokens, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, seed=None,
                 stop_ids=None) -> list[int]:
        """The generated token ids (without the stop id): see `stream`."""
        return list(self.stream(ids, max_tokens, temperature, top_p, top_k, min_p, seed, stop_ids))


def load(model: str | None = None, backend: str = "auto", progress: bool = False) -> Model:
    """Load a checkpoint on a backend ("numpy", "cuda" or "auto"): a folder, a hub id, or None (the default) for the
    model embedded in the package (`tensorfold.models.default_model()`). `progress` shows a bar while the weights
    are read (a hub download always shows one)."""
    ops = make_backend(backend)
    path = default_model() if model is None else resolve(str(model))
    config = ModelConfig.from_file(os.path.join(path, "config.json"))
    weights = load_weights(path, config, progress)
    tokenizer = Tokenizer.from_folder(path, eos_token_ids=config.eos_token_ids)
    return Model(path, config, weights, tokenizer, ops)
