"""The public API: `tensorfold.load(model, backend="auto") -> Model`.

    >>> import tensorfold
    >>> model = tensorfold.load("path/to/checkpoint")          # a folder or a hub id
    >>> ids = model.tokenizer.encode("ROMEO:")
    >>> model.logits(ids).shape                                 # every position of one prompt pass
    (2, 4096)
    >>> model.tokenizer.decode(model.generate(ids, max_tokens=20))
"""
import os
import secrets

import numpy as np

from tensorfold.backends import make_backend
from tensorfold.errors import TensorfoldError
from tensorfold.model.checkpoint import load_weights, resolve
from tensorfold.model.config import ModelConfig
from tensorfold.model.qwen35 import Qwen35
from tensorfold.model.tokenizer import Tokenizer

# Rows per forward of a prompt pass: it bounds memory, and results do not depend on it. A pass runs eagerly, so
# its host work is per chunk: 512 rows took a 2,048-token 2B prompt on an H200 from 1,564 tok/s (128) to 3,125.
PROMPT_CHUNK = 512


class Model:
    """A loaded checkpoint: its config, tokenizer and forward pass on one backend."""

    def __init__(self, path: str, config: ModelConfig, weights: dict, tokenizer: Tokenizer, backend):
        self.path, self.config, self.tokenizer, self.backend = path, config, tokenizer, backend
        self.net = Qwen35(config, weights, backend)

    @property
    def weight_bytes(self) -> int:
        """Bytes the weights take in memory (4-bit weights stay packed)."""
        return sum(getattr(w, "nbytes", 0) for w in self.net.weights.values())

    def _check_ids(self, ids) -> list[int]:
        ids = [int(i) for i in ids]
        if not ids:
            raise TensorfoldError("the prompt is empty: give at least one token id")
        bad = [i for i in ids if not 0 <= i < self.config.vocab_size]
        if bad:
            raise TensorfoldError(f"token id {bad[0]} is outside the vocabulary (0 .. {self.config.vocab_size - 1})")
        return ids

    def prefill(self, ids, state, logits_for="last"):
        """Run a prompt through `state` in chunks of PROMPT_CHUNK rows: the last row's logits (on the backend), or
        all rows' logits (on the host)."""
        chunks = [self.net.forward(ids[i:i + PROMPT_CHUNK], state, logits_for)
                  for i in range(0, len(ids), PROMPT_CHUNK)]
        return np.concatenate([self.backend.to_host(c) for c in chunks]) if logits_for == "all" else chunks[-1]

    def logits(self, ids) -> np.ndarray:
        """float32 [len(ids), vocab_size]: the logits at every position of one prompt pass from a fresh state."""
        ids = self._check_ids(ids)
        return self.prefill(ids, self.net.new_state(), "all")

    def stream(self, ids, max_tokens, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, seed=None, stop_ids=None):
        """Yield generated token ids one by one; stops after `max_tokens` or at a stop id (not yielded).

        `stop_ids=None` uses the checkpoint's own (config and generation_config); pass `()` to ignore them. The
        draw for output position n depends only on (seed, n); `seed=None` picks a random seed.
        """
        ids = self._check_ids(ids)
        if temperature < 0 or not 0 < top_p <= 1 or top_k < 0 or not 0 <= min_p <= 1:
            raise TensorfoldError(f"invalid sampling parameters: temperature={temperature} (>= 0), top_p={top_p} "
                                  f"(0 < top_p <= 1), top_k={top_k} (>= 0), min_p={min_p} (0 .. 1)")
        if len(ids) + max_tokens > self.config.max_position_embeddings:
            raise TensorfoldError(f"this model's maximum context length is {self.config.max_position_embeddings} "
                                  f"tokens; the prompt ({len(ids)}) plus max_tokens ({max_tokens}) exceeds it")
        stops = set(self.tokenizer.stop_ids if stop_ids is None else stop_ids)
        seed = secrets.randbits(63) if seed is None else int(seed)
        state = self.net.new_state(max_rows=len(ids) + max_tokens)
        logits = self.prefill(ids, state)
        for position in range(max_tokens):
            token = self.backend.sample(self.backend.to_host(logits)[-1], seed, position, temperature, top_k,
                                        top_p, min_p)
            if token in stops:
                return
            yield token
            if position + 1 < max_tokens:
                logits = self.net.forward([token], state, "last")

    def generate(self, ids, max_tokens, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, seed=None,
                 stop_ids=None) -> list[int]:
        """The generated token ids (without the stop id): see `stream`."""
        return list(self.stream(ids, max_tokens, temperature, top_p, top_k, min_p, seed, stop_ids))


def load(model: str, backend: str = "auto", progress: bool = False) -> Model:
    """Load a checkpoint (a folder or a hub id) on a backend ("numpy", "cuda" or "auto"); `progress` shows a bar
    while the weights are read (a hub download always shows one)."""
    ops = make_backend(backend)
    path = resolve(str(model))
    config = ModelConfig.from_file(os.path.join(path, "config.json"))
    weights = load_weights(path, config, progress)
    tokenizer = Tokenizer.from_folder(path, eos_token_ids=config.eos_token_ids)
    return Model(path, config, weights, tokenizer, ops)
