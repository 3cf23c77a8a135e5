"""Checkpoint loading: layouts and prefixes, MLX quantization, and a clear error for every broken checkpoint."""
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import tensorfold
from tensorfold.cuda.quantize import exact_factor_bits
from tensorfold.errors import CheckpointError
from tensorfold.model.checkpoint import stored_tensors
from tensorfold.model.safetensors_io import read_header, write_file
from tensorfold.model.writer import dense_tensors, write_checkpoint
from tensorfold.numerics.formats import affine_rows, bf16_to_f32, quantize_affine, significant_bits


def tensors_of(folder):
    """{stored name: (dtype, array)} of a single-file checkpoint."""
    return {n: (i.dtype, i.read()) for n, i in read_header(os.path.join(folder, "model.safetensors")).items()}


def rewrite(src, dst, change):
    """Copy checkpoint `src` to `dst`, passing its tensors through `change(dict) -> dict`."""
    shutil.copytree(src, dst)
    write_file(os.path.join(dst, "model.safetensors"), change(tensors_of(src)))
    return dst


def ids_for(model, n=40, seed=0):
    return np.random.default_rng(seed).integers(0, model.config.vocab_size, n)


# --- MLX affine checkpoints --------------------------------------------------------------------------------------

def test_affine_dequantization_follows_the_mlx_layout():
    """Element 0 of each 8-element run sits in the lowest nibble; w = scale * q + bias per group."""
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(3, 128)).astype(np.float32)
    packed, scale_bits, bias_bits = quantize_affine(weight, 4, 64)
    scales = (scale_bits.astype(np.uint32) << 16).view(np.float32)
    biases = (bias_bits.astype(np.uint32) << 16).view(np.float32)
    expected = np.empty_like(weight)
    for r in range(3):
        for c in range(128):
            q = (int(packed[r, c // 8]) >> (4 * (c % 8))) & 15
            expected[r, c] = np.float32(np.float64(scales[r, c // 64]) * q + np.float64(biases[r, c // 64]))
    assert np.array_equal(affine_rows(packed, scales, biases, 4, 64, np.arange(3)), expected)
    assert np.abs(expected - weight).max() <= scales.max() * 0.51 + 1e-2  # codes are the nearest levels


@pytest.mark.parametrize("fmt", ["mlx4", "mlx8"])
def test_mlx_checkpoint_equals_its_dequantized_weights(tmp_path, fmt):
    """The MLX file and its weights dequantized into an f32 HF checkpoint give the same logits, within the rounding
    of x's fixed point in the integer GEMM (the f32 checkpoint takes the float32 walk): the reference tests' bar."""
    from tensorfold.model.tiny import make_tiny
    make_tiny(tmp_path / "mlx", seed=3, fmt=fmt)
    quantized = tensorfold.load(str(tmp_path / "mlx"), backend="numpy")
    assert quantized.net.weights["layers.0.mlp.up_proj.weight"].kind == "affine"
    assert quantized.net.weights["embed_tokens.weight"].kind == "affine"
    write_checkpoint(tmp_path / "dense", quantized.config, dense_tensors(quantized.net.weights), "hf-f32",
                     tokenizer_from=quantized.path)
    dense = tensorfold.load(str(tmp_path / "dense"), backend="numpy")
    ids = ids_for(dense)
    expected = dense.logits(ids)

    def close(logits):
        return np.abs(logits - expected).max() <= 1e-4 * np.abs(expected).max()
    assert close(quantized.logits(ids))
    # Control: one weight's groups read with a wrong group index must move the logits past the bar.
    w = quantized.net.weights["layers.1.mlp.down_proj.weight"]
    w.scales = np.roll(w.scales, 1, axis=1)
    assert not close(quantized.logits(ids))


def test_mlx_stays_packed(tiny_hf, tiny_mlx4):
    """4-bit weights are held packed: about 5/32 of the float32 size (codes plus per-group scales and biases)."""
    packed = tensorfold.load(tiny_mlx4, backend="numpy").net.weights["layers.0.mlp.up_proj.weight"]
    assert packed.data.dtype == np.uint32 and packed.nbytes < packed.out_features * packed.in_features * 4 / 5


def test_per_module_override(tmp_path, tiny_mlx4):
    """A module quantized at 8 bits inside a 4-bit model, named in the config's per-module overrides."""
    folder = str(tmp_path / "mixed")
    model = tensorfold.load(tiny_mlx4, backend="numpy")
    down = model.net.weights["layers.0.mlp.down_proj.weight"].dense()
    packed, scales, biases = quantize_affine(down, 8, 64)

    def change(tensors):
        module = "language_model.model.layers.0.mlp.down_proj"
        tensors[module + ".weight"] = ("U32", packed)
        tensors[module + ".scales"] = ("BF16", scales)
        tensors[module + ".biases"] = ("BF16", biases)
        return tensors
    rewrite(tiny_mlx4, folder, change)
    with pytest.raises(CheckpointError, match="layers.0.mlp.down_proj.weight"):
        tensorfold.load(folder, backend="numpy")  # the config still says 4 bits: the shape disagrees
    config_path = Path(folder, "config.json")
    config = json.loads(config_path.read_text())
    for key in ("quantization", "quantization_config"):
        config[key]["language_model.model.layers.0.mlp.down_proj"] = {"bits": 8, "group_size": 64}
    config_path.write_text(json.dumps(config))
    loaded = tensorfold.load(folder, backend="numpy").net.weights["layers.0.mlp.down_proj.weight"]
    assert loaded.bits == 8 and np.abs(loaded.dense() - down).max() < np.abs(down).max() / 50


# --- layouts ------------------------------------------------------------------------------------------------------

def test_composite_layout_sharded_with_vision_and_mtp(tmp_path, tiny_hf):
    """The released layout: composite config, `model.language_model.` prefix, shards, vision and MTP tensors."""
    folder = tmp_path / "composite"
    shutil.copytree(tiny_hf, folder)
    os.remove(folder / "model.safetensors")
    tensors = {("lm_head.weight" if n == "lm_head.weight" else "model.language_model." + n[len("model."):]): v
               for n, v in tensors_of(tiny_hf).items()}
    tensors["model.visual.blocks.0.attn.qkv.weight"] = ("BF16", np.zeros((4, 4), np.uint16))
    tensors["mtp.layers.0.mlp.up_proj.weight"] = ("BF16", np.zeros((4, 4), np.uint16))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in shards.items():
        write_file(folder / file, {n: tensors[n] for n in part})
    index = {"weight_map": {n: f for f, part in shards.items() for n in part}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    text = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({
        "model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": text,
        "tie_word_embeddings": False}))
    ours = tensorfold.load(str(folder), backend="numpy")
    flat = tensorfold.load(tiny_hf, backend="numpy")
    ids = ids_for(flat)
    assert ours.logits(ids).tobytes() == flat.logits(ids).tobytes()
    os.remove(folder / "model-00002-of-00002.safetensors")
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors"):
        tensorfold.load(str(folder), backend="numpy")


def test_tied_model_ignores_a_stored_lm_head(tmp_path, checkpoints):
    folder = rewrite(checkpoints["tied"], str(tmp_path / "t"),
                     lambda t: {**t, "lm_head.weight": t["model.embed_tokens.weight"]})
    model = tensorfold.load(folder, backend="numpy")
    assert model.net.lm_head is model.net.weights["embed_tokens.weight"]


def test_hub_id_from_the_local_cache_offline(tmp_path, tiny_hf, monkeypatch):
    """A hub id whose snapshot is cached loads without the network."""
    import huggingface_hub.constants as hub
    repo = tmp_path / "hub" / "models--acme--tiny"
    snapshot = repo / "snapshots" / ("0" * 40)
    shutil.copytree(tiny_hf, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    model = tensorfold.load("acme/tiny", backend="numpy")
    assert os.path.samefile(model.path, snapshot)


def test_not_a_folder_nor_a_hub_id():
    with pytest.raises(CheckpointError, match="no such folder"):
        tensorfold.load("./no/such/checkpoint", backend="numpy")


# --- broken checkpoints: every case names the tensor or file ------------------------------------------------------

def drop(name):
    return lambda t: {n: v for n, v in t.items() if n != name}


BROKEN = {
    "missing tensor": (drop("model.layers.1.mlp.up_proj.weight"), "missing tensor layers.1.mlp.up_proj.weight"),
    "extra tensor": (lambda t: {**t, "model.layers.9.mlp.up_proj.weight": t["model.norm.weight"]},
                     "unexpected tensor model.layers.9.mlp.up_proj.weight"),
    "wrong shape": (lambda t: {**t, "model.norm.weight": ("BF16", np.zeros(63, np.uint16))},
                    r"model.norm.weight: shape \[63\], expected \[64\]"),
    "wrong matrix shape": (lambda t: {**t, "model.layers.0.mlp.up_proj.weight": ("BF16", np.zeros((128, 63), np.uint16))},
                           r"model.layers.0.mlp.up_proj.weight: shape \[128, 63\], expected \[128, 64\]"),
    "wrong dtype": (lambda t: {**t, "model.norm.weight": ("I32", np.zeros(64, np.int32))},
                    "model.norm.weight: dtype I32"),
    "wrong conv layout": (lambda t: {**t, "model.layers.0.linear_attn.conv1d.weight":
                                     ("BF16", np.zeros((128, 4, 4), np.uint16))},
                          "model.layers.0.linear_attn.conv1d.weight: shape"),
    "scales without biases": (lambda t: {**t, "model.layers.0.mlp.up_proj.scales": ("BF16", np.zeros((128, 1), np.uint16))},
                              "scales without biases"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_checkpoint_names_the_tensor(tmp_path, tiny_hf, case):
    change, message = BROKEN[case]
    folder = rewrite(tiny_hf, str(tmp_path / "broken"), change)
    with pytest.raises(CheckpointError, match=message):
        tensorfold.load(folder, backend="numpy")


def test_significant_bits_of_float32_values():
    """Counted from the highest set bit of the significand (a normal number's implicit one included) to the lowest.
    Control: a value one unit past 1.0 in the last place has all 24."""
    values = np.array([0.0, 1.0, 1.5, -0.75, 3.0, 2.0 ** -140, np.nextafter(np.float32(1), np.float32(2))],
                      np.float32)
    assert significant_bits(values).tolist() == [0, 1, 2, 2, 2, 1, 24]


def test_float32_scales_load_only_where_the_gemm_multiplies_them_exactly(tmp_path, tiny_mlx4):
    """A module's scales stored as float32 load where each fits the bits that keep the affine GEMM's products exact
    (quantize.exact_factor_bits: the GPU kernel fuses s * D + b * S into one rounding where the twin rounds twice,
    the same bits only while s * D is exact), and are refused by name where a value has more. Control: the same
    module's bf16 scales, stored as float32, load and hold the bf16 file's values."""
    module = "language_model.model.layers.0.mlp.down_proj"
    name = "layers.0.mlp.down_proj.weight"

    def stored_as_f32(widen):
        def change(tensors):
            values = bf16_to_f32(tensors[module + ".scales"][1])
            if widen:  # one unit in the last place more: 24 significant bits
                values = np.nextafter(values, np.float32(np.inf))
            tensors[module + ".scales"] = ("F32", values.astype(np.float32))
            return tensors
        return change

    original = tensorfold.load(tiny_mlx4, backend="numpy").net.weights[name]
    assert significant_bits(original.scales).max() <= 8 < exact_factor_bits(original.bits, original.group_size)[0]
    loaded = tensorfold.load(rewrite(tiny_mlx4, str(tmp_path / "f32"), stored_as_f32(False)), backend="numpy")
    assert np.array_equal(loaded.net.weights[name].scales, original.scales)
    with pytest.raises(CheckpointError, match=f"{module}.scales: float32 values with up to 24 significant bits"):
        tensorfold.load(rewrite(tiny_mlx4, str(tmp_path / "wide"), stored_as_f32(True)), backend="numpy")


def test_quantized_weight_without_quantization_config(tmp_path, tiny_mlx4):
    folder = str(tmp_path / "q")
    shutil.copytree(tiny_mlx4, folder)
    config_path = Path(folder, "config.json")
    config = json.loads(config_path.read_text())
    del config["quantization"], config["quantization_config"]
    config_path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="quantized but config.json has no quantization"):
        tensorfold.load(folder, backend="numpy")


@pytest.mark.parametrize("cut", [4, 100, -10])
def test_truncated_file(tmp_path, tiny_hf, cut):
    folder = str(tmp_path / "cut")
    shutil.copytree(tiny_hf, folder)
    path = Path(folder, "model.safetensors")
    path.write_bytes(path.read_bytes()[:cut])
    with pytest.raises(CheckpointError, match="truncated|not a safetensors file"):
        tensorfold.load(folder, backend="numpy")


def test_truncated_file_names_the_tensor(tmp_path, tiny_hf):
    folder = str(tmp_path / "cut")
    shutil.copytree(tiny_hf, folder)
    path = os.path.join(folder, "model.safetensors")
    last = max(read_header(path).values(), key=lambda info: info.end)
    Path(path).write_bytes(Path(path).read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=f"tensor {last.name} .*truncated"):
        stored_tensors(folder)


@pytest.mark.parametrize("header", [b"{not json", b'["a list"]',
                                    b'{"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}',
                                    b'{"x": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}'])
def test_hostile_header(tmp_path, tiny_hf, header):
    folder = str(tmp_path / "bad")
    shutil.copytree(tiny_hf, folder)
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header + b"\0" * 64)
    with pytest.raises(CheckpointError):
        tensorfold.load(folder, backend="numpy")


def test_no_safetensors_files(tmp_path, tiny_hf):
    folder = str(tmp_path / "none")
    shutil.copytree(tiny_hf, folder)
    os.remove(os.path.join(folder, "model.safetensors"))
    with pytest.raises(CheckpointError, match="no .safetensors files"):
        tensorfold.load(folder, backend="numpy")
