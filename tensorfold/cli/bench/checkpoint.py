"""The random checkpoints `tensorfold bench decode|prefill|all` runs on: MLX 4-bit, with the shapes of a released
Qwen3.5 size (or the tiny test config), written once into a cache folder and reused. The matrices are drawn packed
(random 4-bit codes), which is quick where quantizing float weights (`make_tiny`) at a released size is slow.
"""
import dataclasses
import math
import os
import shutil
import time

import numpy as np

from tensorfold.model.presets import PRESETS

CONFIG_NAMES = (*PRESETS, "tiny")  # "tiny": make_tiny's test config, for a run on the CPU
MLX_GROUP = 64
CODE_STD = math.sqrt((16 ** 2 - 1) / 12)  # the standard deviation of a 4-bit code drawn uniformly from 0 .. 15


def bench_config(name: str):
    """The ModelConfig of a config name: a released size from presets.py, or "tiny"."""
    from tensorfold.errors import TensorfoldError
    from tensorfold.model.presets import preset
    from tensorfold.model.tiny import TINY_CONFIG
    if name == "tiny":
        return TINY_CONFIG
    try:
        return preset(name)
    except KeyError:
        raise TensorfoldError(f"unknown config {name!r}: choose one of {', '.join(CONFIG_NAMES)}") from None


def default_cache() -> str:
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tensorfold", "bench")


def random_vector(name: str, shape: tuple, rng) -> np.ndarray:
    """A norm weight, conv weight or gate parameter in canonical HF form, drawn as make_tiny draws it."""
    if name.endswith("A_log"):
        return np.log(rng.uniform(1.0, 16.0, shape))
    if name.endswith("dt_bias"):
        return rng.normal(0.0, 1.0, shape)
    if name.endswith("conv1d.weight"):
        return rng.normal(0.0, 0.5, shape)
    if name.endswith("linear_attn.norm.weight"):
        return 1.0 + rng.normal(0.0, 0.3, shape)  # the plain norm: its weight multiplies directly
    return rng.normal(0.0, 0.3, shape)  # a centred norm (the writer adds the 1 for MLX)


def random_affine(shape: tuple, std: float, rng) -> tuple:
    """A random 4-bit MLX matrix as stored (packed uint32 codes, bf16 scales, bf16 biases): eight uniform codes a
    word, one scale for the whole matrix giving weights of standard deviation `std`, and the bias centring them."""
    from tensorfold.numerics.formats import f32_to_bf16
    out_features, in_features = shape
    packed = rng.integers(0, 1 << 32, size=(out_features, in_features // 8), dtype=np.uint32)
    scale = std / CODE_STD
    groups = (out_features, in_features // MLX_GROUP)
    return (packed, np.full(groups, f32_to_bf16(np.float32(scale))),
            np.full(groups, f32_to_bf16(np.float32(-7.5 * scale))))


def write_random_mlx4(folder: str, config, seed: int) -> None:
    """A random MLX 4-bit checkpoint of `config`: make_tiny's tokenizer, the vectors through the writer (config.json
    and model.safetensors), and the matrices drawn packed into matrices.safetensors (the loader reads every
    .safetensors file of a folder). Weights have make_tiny's spread: 1 / sqrt(in), and 1 for the embedding."""
    from tensorfold.model.checkpoint import expected_shapes
    from tensorfold.model.safetensors_io import write_file
    from tensorfold.model.tiny_corpus import TINY_CORPUS
    from tensorfold.model.tokenizer import Tokenizer, train_bpe_tokenizer
    from tensorfold.model.writer import switch_mlp_parts, write_checkpoint

    train_bpe_tokenizer([TINY_CORPUS], config.vocab_size - 4, folder)  # the trainer adds 4 tokens of its own
    config = dataclasses.replace(config, eos_token_ids=Tokenizer.from_folder(folder).stop_ids)
    rng = np.random.default_rng(seed)
    shapes = expected_shapes(config)
    vectors, matrices = {}, {}
    started = time.perf_counter()
    for done, (name, shape) in enumerate(shapes.items(), 1):
        if len(shape) == 1 or name.endswith("conv1d.weight"):
            vectors[name] = random_vector(name, shape, rng).astype(np.float32)
        else:
            std = 1.0 if name == "embed_tokens.weight" else 1.0 / math.sqrt(shape[-1])
            # an MoE layer's expert stack [experts, out, in] is stored as MLX's switch_mlp stacks
            parts = switch_mlp_parts(name, shape) if len(shape) == 3 else [(name, slice(0, shape[0]))]
            for part, rows in parts:
                module = "language_model." + ("lm_head" if part == "lm_head.weight" else "model." + part.removesuffix(
                    ".weight"))
                lead = shape[:-2] + (rows.stop - rows.start,)  # [experts, out] or [out]
                drawn = random_affine((math.prod(lead), shape[-1]), std, rng)
                matrices.update({f"{module}.{field}": (dtype, array.reshape(lead + array.shape[-1:])) for field, dtype,
                                 array in zip(("weight", "scales", "biases"), ("U32", "BF16", "BF16"), drawn)})
        if done % max(1, len(shapes) // 4) == 0:
            print(f"#   drawn {done}/{len(shapes)} tensors ({time.perf_counter() - started:.1f} s)", flush=True)
    print("#   writing the files", flush=True)
    write_checkpoint(folder, config, vectors, "mlx4", group_size=MLX_GROUP)
    write_file(os.path.join(folder, "matrices.safetensors"), matrices, metadata={"format": "pt"})


def checkpoint_folder(name: str, seed: int, cache: str) -> str:
    """The cached random checkpoint of a config, written first when absent (into a folder renamed once complete,
    so an interrupted write is never reused)."""
    folder = os.path.join(cache, f"qwen3.5-{name}-mlx4-random{seed}")
    if os.path.exists(os.path.join(folder, "config.json")):
        print(f"# checkpoint {folder} (cached)", flush=True)
        return folder
    config = bench_config(name)
    partial = folder + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    print(f"# writing a random {name} checkpoint to {folder}", flush=True)
    started = time.perf_counter()
    write_random_mlx4(partial, config, seed)
    os.replace(partial, folder)
    print(f"# written in {time.perf_counter() - started:.1f} s", flush=True)
    return folder
