"""The peer of `tensorfold bench`: transformers' own Qwen3.5 model with the same config, in bf16 with random weights,
on the same device: greedy batch-1 decode in a loop of one-token forwards on its cache (each token id copied to the
host, as a streaming server does) and cold prefill.
"""
import importlib.util
import inspect
import time


def peer_unavailable(backend_name: str) -> str | None:
    """Why the peer cannot run by default here, or None when it can (torch and transformers with CUDA)."""
    if backend_name != "cuda":
        return "the numpy backend (ask for it with --peer)"
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        return f"{' and '.join(missing)} not installed"
    import torch
    return None if torch.cuda.is_available() else "torch sees no CUDA device"


class Peer:
    """transformers' Qwen3_5ForCausalLM (Qwen3_5MoeForCausalLM for an MoE config) with the same config in bf16,
    random weights, on `device`."""

    def __init__(self, config, device: str):
        import torch
        import transformers
        transformers.logging.set_verbosity_error()  # its fallback warnings say what `fast_paths` reports
        self.torch, self.device = torch, device
        family = "Qwen3_5Moe" if config.is_moe else "Qwen3_5"
        hf_config = getattr(transformers, family + "TextConfig")(**config.to_dict())
        with torch.device(device):
            model = getattr(transformers, family + "ForCausalLM")
            self.model = model._from_config(hf_config, dtype=torch.bfloat16).eval()
        parameters = inspect.signature(self.model.forward).parameters
        self.cache_argument = "cache" if "cache" in parameters else "past_key_values"  # the older name

    def forward(self, ids, cache=None):
        """The last row's logits of `ids` continuing `cache` (None: a fresh one), and the cache."""
        ids = self.torch.tensor([ids], device=self.device)
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{self.cache_argument: cache})
        return out.logits[0, -1], out.past_key_values

    def synchronize(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def decode_rate(self, prompt: list, tokens: int, warmup: int) -> dict:
        """Greedy batch-1 decode: one-token forwards on the cache, each token id copied to the host."""
        with self.torch.inference_mode():
            logits, cache = self.forward(prompt)
            for step in range(warmup + tokens):
                if step == warmup:
                    self.synchronize()
                    started = time.perf_counter()
                logits, cache = self.forward([int(logits.argmax())], cache)
            self.synchronize()
        seconds = time.perf_counter() - started
        return {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds}

    def prefill_rate(self, length: int, rng) -> dict:
        """Cold prefill tok/s of a `length`-token prompt: one forward from a fresh cache to the last logits."""
        ids = rng.integers(0, self.model.config.vocab_size, length).tolist()
        with self.torch.inference_mode():
            self.synchronize()
            started = time.perf_counter()
            try:
                self.forward(ids)
            except self.torch.cuda.OutOfMemoryError:
                self.torch.cuda.empty_cache()
                return {"tokens": length, "skipped": "out of memory"}
            self.synchronize()
        seconds = time.perf_counter() - started
        return {"tokens": length, "seconds": seconds, "tok_s": length / seconds}
