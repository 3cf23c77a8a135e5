"""The Qwen3.5 hybrid model: config, weights and forward pass."""
