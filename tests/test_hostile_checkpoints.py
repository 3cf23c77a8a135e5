"""Hostile checkpoints: each is refused with one line naming the file and the problem, in bounded time and memory.

Every case is a small change to one good tiny checkpoint, built once for the module. Each test starts from a fresh
copy that is first shown to load, so the refusal can only come from the change.
"""
import contextlib
import json
import math
import os
import pickle
import shutil
import signal
import struct
from datetime import timedelta

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tensorfold
from tensorfold.errors import CheckpointError, ConfigError
from tensorfold.model.config import MAX_LAYERS, ModelConfig
from tensorfold.model.files import MAX_JSON_BYTES
from tensorfold.model.safetensors_io import DTYPES, MAX_HEADER_BYTES, read_header
from tensorfold.model.tiny import make_tiny

DEEP = 100_000  # nesting far beyond what Python's JSON parser recurses through


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    folder = tmp_path_factory.mktemp("good")
    make_tiny(folder, seed=5)
    return folder


@pytest.fixture
def copy(good, tmp_path):
    """A fresh copy of the good checkpoint, shown to load before the test changes it."""
    folder = tmp_path / "model"
    shutil.copytree(good, folder)
    tensorfold.load(str(folder), backend="numpy")
    return folder


class Overtime(Exception):
    """Raised by the alarm of `time_limit`."""


@contextlib.contextmanager
def time_limit(seconds):
    """Fail the test, instead of hanging the suite, if the block runs longer than `seconds`."""
    def expire(signum, frame):
        raise Overtime
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except Overtime:
        # Without its traceback: one raised by a signal can lack line numbers, which pytest cannot print.
        pytest.fail(f"still running after {seconds} s", pytrace=False)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def refused(folder, error, *words, seconds=5) -> str:
    """Loading `folder` raises `error` within `seconds`, with a one-line message holding every one of `words`."""
    with time_limit(seconds), pytest.raises(error) as caught:
        tensorfold.load(str(folder), backend="numpy")
    message = str(caught.value)
    assert "\n" not in message
    for word in words:
        assert str(word) in message, message
    return message


def write_safetensors(path, header: bytes, data: bytes) -> None:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


def edit_header(folder, change) -> None:
    """Pass model.safetensors' JSON header through `change(header)`; the data bytes stay as they are."""
    path = folder / "model.safetensors"
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    change(header)
    write_safetensors(path, json.dumps(header).encode(), raw[8 + length:])


def edit_json(path, change) -> None:
    value = json.loads(path.read_text())
    change(value)
    path.write_text(json.dumps(value))


NORM = "model.norm.weight"  # BF16 [64]


# --- config.json ----------------------------------------------------------------------------------------------------

def test_deeply_nested_config(copy):
    text = (copy / "config.json").read_text().rstrip()
    (copy / "config.json").write_text(text[:-1] + ', "nested": ' + "[" * DEEP + "]" * DEEP + "}")
    refused(copy, ConfigError, copy / "config.json", "nests arrays or objects too deeply")


def test_config_linked_to_dev_zero(copy):
    os.remove(copy / "config.json")
    os.symlink("/dev/zero", copy / "config.json")
    refused(copy, ConfigError, copy / "config.json", "links to /dev/zero, outside the checkpoint folder")


def test_config_is_a_fifo(copy):
    os.remove(copy / "config.json")
    os.mkfifo(copy / "config.json")
    refused(copy, ConfigError, copy / "config.json", "is a FIFO (named pipe), not a regular file")


def test_config_over_the_size_limit(copy):
    with open(copy / "config.json", "r+b") as f:
        f.truncate(MAX_JSON_BYTES + 1)  # sparse: costs no disk
    refused(copy, ConfigError, copy / "config.json", f"over the limit of {MAX_JSON_BYTES} bytes")


def test_a_billion_layers_without_layer_types(copy):
    edit_json(copy / "config.json", lambda c: (c.pop("layer_types"), c.update(num_hidden_layers=1_000_000_000)))
    refused(copy, ConfigError, copy / "config.json", f"num_hidden_layers must be at most {MAX_LAYERS}",
            "got 1000000000")


@pytest.mark.parametrize("field, value, problem", [
    ("vocab_size", 0, "vocab_size must be a positive integer, got 0"),
    ("hidden_size", "x", "hidden_size must be a positive integer, got 'x'"),
    ("head_dim", None, "missing required field head_dim"),
    ("layer_types", "linear_attention", "layer_types must be a list"),
    ("rms_norm_eps", -1, "rms_norm_eps must be a positive number"),
])
def test_a_bad_config_value_is_refused_naming_the_file(copy, field, value, problem):
    edit_json(copy / "config.json", lambda c: c.update({field: value}))
    refused(copy, ConfigError, copy / "config.json", problem)


def test_a_million_stop_ids_parse_in_linear_time(copy):
    """Not refused, but bounded: repeated ids are merged in one pass, not one search per id."""
    config = json.loads((copy / "config.json").read_text())
    config["eos_token_id"] = list(range(1_000_000))
    with time_limit(5):
        assert len(ModelConfig.from_dict(config).eos_token_ids) == 1_000_000


# --- the safetensors header -----------------------------------------------------------------------------------------

def set_entry(name, **fields):
    return lambda header: header[name].update(fields)


HEADER_CASES = {
    "dtype as a list": (set_entry(NORM, dtype=["BF16"]), 'unsupported dtype ["BF16"]'),
    "shape as a number": (set_entry(NORM, shape=64), "invalid shape 64"),
    "shape of 2**70": (set_entry(NORM, shape=[2**70]), f"does not hold BF16 [{2**70}]"),
    # NumPy's int64 product of this shape is 0, which an empty byte range would match.
    "byte count wraps int64 to 0": (lambda h: h[NORM].update(shape=[2**32, 2**32], data_offsets=[0, 0]),
                                    f"({2**64 * 2} bytes)"),
    "negative dimension": (set_entry(NORM, shape=[-64]), "invalid shape [-64]"),
    "offsets past the end": (lambda h: h[NORM].update(data_offsets=[10**9, 10**9 + 128]), "the file is truncated"),
    "offsets as a string": (set_entry(NORM, data_offsets="0-128"), 'invalid data_offsets "0-128"'),
    "entry not an object": (lambda h: h.update({NORM: [1, 2]}), "malformed header entry [1, 2]"),
    "name with a newline": (lambda h: h.update({"bad\nname": h.pop(NORM)}), r'tensor name "bad\nname"'),
}


@pytest.mark.parametrize("case", sorted(HEADER_CASES))
def test_hostile_header_entry(copy, case):
    change, problem = HEADER_CASES[case]
    edit_header(copy, change)
    refused(copy, CheckpointError, copy / "model.safetensors", problem)


def test_deeply_nested_header(copy):
    write_safetensors(copy / "model.safetensors", b'{"x": ' + b"[" * DEEP + b"]" * DEEP + b"}", b"")
    refused(copy, CheckpointError, copy / "model.safetensors", "nests arrays or objects too deeply")


def test_header_length_over_the_limit(copy):
    with open(copy / "model.safetensors", "r+b") as f:
        f.write(struct.pack("<Q", 1 << 40))
    refused(copy, CheckpointError, copy / "model.safetensors", f"over the format's limit of {MAX_HEADER_BYTES}")


def test_overlapping_tensors(copy):
    first, second = "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight"
    edit_header(copy, lambda h: h[second].update(data_offsets=h[first]["data_offsets"]))
    refused(copy, CheckpointError, copy / "model.safetensors", "overlap", first, second)


# --- the weights files and the index --------------------------------------------------------------------------------

def test_weights_are_a_fifo(copy):
    os.remove(copy / "model.safetensors")
    os.mkfifo(copy / "model.safetensors")
    refused(copy, CheckpointError, copy / "model.safetensors", "is a FIFO (named pipe), not a regular file")


def test_weights_linked_outside_the_folder(copy, tmp_path):
    outside = tmp_path / "elsewhere.safetensors"
    shutil.move(copy / "model.safetensors", outside)
    os.symlink(outside, copy / "model.safetensors")
    refused(copy, CheckpointError, copy / "model.safetensors", f"links to {outside}, outside the checkpoint folder")


def test_a_link_inside_the_folder_loads(copy):
    os.rename(copy / "model.safetensors", copy / "weights.bin")
    os.symlink("weights.bin", copy / "model.safetensors")
    tensorfold.load(str(copy), backend="numpy")
    os.rename(copy / "weights.bin", copy / "moved.bin")  # control: the same link, dangling, is refused
    refused(copy, CheckpointError, copy / "model.safetensors", "is missing")


def test_a_directory_named_like_a_shard(copy):
    os.mkdir(copy / "extra.safetensors")
    refused(copy, CheckpointError, copy / "extra.safetensors", "is a directory, not a regular file")


def write_index(folder, weight_map):
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def test_weight_map_as_a_list(copy):
    write_index(copy, ["model.safetensors"])
    refused(copy, CheckpointError, copy / "model.safetensors.index.json", 'weight_map must be an object',
            'got ["model.safetensors"]')


def test_weight_map_with_a_non_string_file(copy):
    names = read_header(copy / "model.safetensors")
    write_index(copy, {**dict.fromkeys(names, "model.safetensors"), NORM: 7})
    refused(copy, CheckpointError, copy / "model.safetensors.index.json", f'weight_map["{NORM}"] must be a shard '
            f"file name, got 7")


def test_index_naming_a_shard_outside_the_folder(copy):
    names = read_header(copy / "model.safetensors")
    write_index(copy, dict.fromkeys(names, "../model.safetensors"))
    refused(copy, CheckpointError, "the index names shard '../model.safetensors', which is not in the folder")


def test_pickles_are_refused_and_never_run(copy, tmp_path):
    marker = tmp_path / "the pickle ran"

    class Payload:
        def __reduce__(self):
            return open, (str(marker), "w")

    os.remove(copy / "model.safetensors")
    (copy / "pytorch_model.bin").write_bytes(pickle.dumps(Payload()))
    refused(copy, CheckpointError, "no .safetensors files")
    assert not marker.exists()


# --- the tokenizer files --------------------------------------------------------------------------------------------

def test_garbage_tokenizer_json(copy):
    (copy / "tokenizer.json").write_text('{"model": "garbage"}')
    refused(copy, CheckpointError, copy / "tokenizer.json", "is not a tokenizer that the tokenizers library can read")


def test_tokenizer_json_is_a_fifo(copy):
    os.remove(copy / "tokenizer.json")
    os.mkfifo(copy / "tokenizer.json")
    refused(copy, CheckpointError, copy / "tokenizer.json", "is a FIFO (named pipe), not a regular file")


@pytest.mark.parametrize("content, problem", [
    (b"\x00garbage{", "is not valid JSON"),
    (b"[2, 0]", "must hold a JSON object, got a JSON list"),
    (b'{"eos_token_id": {"id": 2}}', 'eos_token_id must be a non-negative integer or a list of them, got {"id": 2}'),
    (b'{"eos_token_id": [2, [0]]}', "eos_token_id must be a non-negative integer or a list of them, got [2, [0]]"),
])
def test_garbage_generation_config(copy, content, problem):
    (copy / "generation_config.json").write_bytes(content)
    refused(copy, CheckpointError, copy / "generation_config.json", problem)


def test_chat_template_syntax_error(copy):
    (copy / "chat_template.jinja").write_text("{% for m in messages %}\n{{ m.content }\n")
    refused(copy, CheckpointError, copy / "chat_template.jinja", "the chat template does not compile", "(line 2)")


def test_chat_template_in_tokenizer_config_not_a_string(copy):
    os.remove(copy / "chat_template.jinja")
    edit_json(copy / "tokenizer_config.json", lambda c: c.update(chat_template=42))
    refused(copy, CheckpointError, copy / "tokenizer_config.json", "chat_template must be a string", "got 42")


# --- the hub cache: a snapshot's files are links into the repo's blobs ----------------------------------------------

def hub_cache(good, root):
    """A hub cache holding `good` as acme/tiny, laid out as the hub lays it out: real files in blobs/, links in the
    snapshot. Returns the snapshot folder."""
    repo = root / "models--acme--tiny"
    snapshot = repo / "snapshots" / ("0" * 40)
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, name in enumerate(sorted(os.listdir(good))):
        shutil.copy(good / name, repo / "blobs" / f"{i:064x}")
        os.symlink(f"../../blobs/{i:064x}", snapshot / name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    return snapshot


def test_hub_snapshot_links_into_its_blobs(good, tmp_path, monkeypatch):
    import huggingface_hub.constants as hub
    snapshot = hub_cache(good, tmp_path / "hub")
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    model = tensorfold.load("acme/tiny", backend="numpy")
    assert os.path.samefile(model.path, snapshot)
    outside = tmp_path / "outside.json"  # control: a snapshot link that leaves the blobs is refused
    shutil.copy(snapshot / "config.json", outside)
    os.remove(snapshot / "config.json")
    os.symlink(outside, snapshot / "config.json")
    with pytest.raises(ConfigError, match="outside the checkpoint folder"):
        tensorfold.load("acme/tiny", backend="numpy")


# --- the control ----------------------------------------------------------------------------------------------------

def test_the_good_checkpoint_loads_as_an_untouched_copy_does(good, tmp_path):
    untouched = shutil.copytree(good, tmp_path / "untouched")
    ours, theirs = tensorfold.load(str(good), backend="numpy"), tensorfold.load(str(untouched), backend="numpy")
    stored = read_header(good / "model.safetensors")["model.embed_tokens.weight"].read()
    assert np.array_equal(ours.net.weights["embed_tokens.weight"].data, stored)  # the file's bytes, as stored
    ids = np.arange(3, 500, 41)
    assert ours.logits(ids).tobytes() == theirs.logits(ids).tobytes()


# --- fuzzed safetensors headers: a CheckpointError or a clean read, never another exception or a hang -------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12)
sizes = st.integers(-4, 300) | st.sampled_from([2**32, 2**63, 2**64, 2**70]) | json_values


@st.composite
def entries(draw):
    """A header entry: a well-formed one (its byte range fits its shape) with at most one field spoiled or missing."""
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    shape = draw(st.lists(st.integers(0, 4), max_size=3))
    begin = draw(st.integers(0, 64))
    entry = {"dtype": dtype, "shape": shape,
             "data_offsets": [begin, begin + math.prod(shape) * np.dtype(DTYPES[dtype]).itemsize]}
    spoiled = {"dtype": st.sampled_from(["C64", "bf16"]) | json_values, "shape": st.lists(sizes, max_size=4) | json_values,
               "data_offsets": st.lists(sizes, max_size=3) | json_values}
    field = draw(st.sampled_from([None, None, None, *sorted(entry)]))
    if field is not None:
        if draw(st.booleans()):
            del entry[field]
        else:
            entry[field] = draw(spoiled[field])
    return entry


names = st.sampled_from(["a", "b", "c.weight", "__metadata__"]) | st.text(max_size=4)
tensor_headers = st.dictionaries(names, st.one_of(entries(), entries(), entries(), json_values), min_size=1,
                                 max_size=3).map(json.dumps)
other_headers = (json_values.map(json.dumps) | st.integers(0, 5000).map(lambda depth: "[" * depth + "]" * depth)
                 | st.text(max_size=40))
headers = st.integers(0, 3).flatmap(lambda pick: other_headers if pick == 3 else tensor_headers)


@pytest.fixture(scope="module")
def fuzz_file(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz") / "model.safetensors"


@settings(max_examples=200, deadline=timedelta(milliseconds=500))
@given(header=headers, data_bytes=st.integers(0, 600))
def test_fuzzed_header_is_refused_or_read(fuzz_file, header, data_bytes):
    write_safetensors(fuzz_file, header.encode(), bytes(range(256)) * (data_bytes // 256) + bytes(data_bytes % 256))
    try:
        for info in read_header(fuzz_file).values():
            assert info.read().nbytes == info.end - info.begin
    except CheckpointError as e:
        assert str(fuzz_file) in str(e) and "\n" not in str(e)
