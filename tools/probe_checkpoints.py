"""The hostile checkpoint folders of tools/probe_server.py, each a small change to one good tiny checkpoint, and the
CLI run on each in a child process with a time and a memory bound.

A folder the loader must refuse answers `tensorfold generate` with exit status 2 and one line, `tensorfold: error:
...`, naming the file at fault (where there is one); no traceback, no hang, no memory past the bound. Changed config
values that make another valid model may also load (exit 0). The untouched copy must load: the control.

    python tools/probe_checkpoints.py   # alone: prints each folder and what the CLI answered
"""
import concurrent.futures
import json
import os
import pickle
import resource
import shutil
import struct
import subprocess
import sys
import time

MEMORY_BOUND = 3 << 30  # bytes of address space the CLI may map: the tiny model takes a few MiB
TIME_BOUND = 60.0  # seconds per folder
NORM = "model.norm.weight"
FIRST, SECOND = "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight"


def edit_json(path, change):
    with open(path) as f:
        value = json.load(f)
    change(value)
    with open(path, "w") as f:
        json.dump(value, f)


def write_text(name, text):
    def change(folder):
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    return change


def replace_with(name, kind, target=None):
    """`name` removed and put back as a FIFO, a link to `target`, or a directory."""
    def change(folder):
        path = os.path.join(folder, name)
        if os.path.lexists(path):
            os.remove(path)
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "link":
            os.symlink(target(folder) if callable(target) else target, path)
        elif kind == "dir":
            os.mkdir(path)
    return change


def sparse(name, size):
    def change(folder):
        with open(os.path.join(folder, name), "r+b") as f:
            f.truncate(size)
    return change


def header_edit(change):
    """model.safetensors' JSON header passed through `change`; the data bytes stay as they are."""
    def edit(folder):
        path = os.path.join(folder, "model.safetensors")
        with open(path, "rb") as f:
            raw = f.read()
        (length,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + length])
        text = change(header)
        encoded = (text if isinstance(text, str) else json.dumps(header)).encode()
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(encoded)) + encoded + raw[8 + length:])
    return edit


def raw_weights(data: bytes):
    return lambda folder: open(os.path.join(folder, "model.safetensors"), "wb").write(data)


def config_edit(change):
    return lambda folder: edit_json(os.path.join(folder, "config.json"), change)


def index(weight_map):
    def write(folder):
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            json.dump({"weight_map": weight_map(folder) if callable(weight_map) else weight_map}, f)
    return write


def tensor_names(folder):
    with open(os.path.join(folder, "model.safetensors"), "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return [n for n in json.loads(f.read(length)) if n != "__metadata__"]


def pickle_only(folder):
    class Payload:
        def __reduce__(self):
            return open, (os.path.join(folder, "..", "the pickle ran"), "w")
    os.remove(os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "pytorch_model.bin"), "wb") as f:
        f.write(pickle.dumps(Payload()))


def outside(folder):
    """model.safetensors moved out of the folder, a link left in its place."""
    target = os.path.join(os.path.dirname(folder), os.path.basename(folder) + "-weights.safetensors")
    shutil.move(os.path.join(folder, "model.safetensors"), target)
    os.symlink(target, os.path.join(folder, "model.safetensors"))


def truncate_weights(folder):
    path = os.path.join(folder, "model.safetensors")
    os.truncate(path, os.path.getsize(path) - 100)


DEEP = "[" * 100_000 + "]" * 100_000
ST, CONFIG, TOKENIZER = "model.safetensors", "config.json", "tokenizer.json"


def refusals() -> dict:
    """name -> (change(folder), the file the refusal must name or None). Each must be refused."""
    def entry(**fields):
        return header_edit(lambda h: h[NORM].update(fields))
    return {
        "config nested 100000 deep": (write_text(CONFIG, '{"a": ' + DEEP + "}"), CONFIG),
        "config linked to /dev/zero": (replace_with(CONFIG, "link", "/dev/zero"), CONFIG),
        "config a FIFO": (replace_with(CONFIG, "fifo"), CONFIG),
        "config a directory": (replace_with(CONFIG, "dir"), CONFIG),
        "config over 64 MiB (sparse)": (sparse(CONFIG, (64 << 20) + 1), CONFIG),
        "config missing": (lambda f: os.remove(os.path.join(f, CONFIG)), None),
        "config empty": (write_text(CONFIG, ""), CONFIG), "config not JSON": (write_text(CONFIG, "{model"), CONFIG),
        "config a list": (write_text(CONFIG, "[1]"), CONFIG), "config a 5000-digit number": (write_text(
            CONFIG, '{"vocab_size": ' + "9" * 5000 + "}"), CONFIG),
        "config text_config a list": (config_edit(lambda c: c.update(text_config=[1])), None),
        "a billion layers without layer_types": (config_edit(lambda c: (c.pop("layer_types"),
                                                                        c.update(num_hidden_layers=10**9))), None),
        "header dtype a list": (entry(dtype=["BF16"]), ST), "header shape a number": (entry(shape=64), ST),
        "header shape 2^70": (entry(shape=[2**70]), ST), "header negative dimension": (entry(shape=[-64]), ST),
        "header byte count wraps int64 to 0": (entry(shape=[2**32, 2**32], data_offsets=[0, 0]), ST),
        "header offsets past the end": (entry(data_offsets=[10**9, 10**9 + 128]), ST),
        "header offsets a string": (entry(data_offsets="0-128"), ST),
        "header offsets floats": (entry(data_offsets=[0.0, 128.0]), ST),
        "header entry a list": (header_edit(lambda h: h.update({NORM: [1, 2]})), ST),
        "header name with a newline": (header_edit(lambda h: h.update({"bad\nname": h.pop(NORM)})), ST),
        "header nested 100000 deep": (header_edit(lambda h: '{"x": ' + DEEP + "}"), ST),
        "header a list": (header_edit(lambda h: "[1, 2]"), ST), "header not JSON": (header_edit(lambda h: "{no"), ST),
        "header NaN shape": (header_edit(lambda h: json.dumps(h).replace('"shape": [64]', '"shape": [NaN]', 1)), ST),
        "overlapping tensors": (header_edit(lambda h: h[SECOND].update(data_offsets=h[FIRST]["data_offsets"])), ST),
        "a tensor missing": (header_edit(lambda h: h.pop(NORM)), None),
        "an unknown tensor": (header_edit(lambda h: h.update({"model.extra.weight": {
            "dtype": "U8", "shape": [0], "data_offsets": [0, 0]}})), None),
        "a tensor of the wrong shape": (header_edit(lambda h: h[NORM].update(
            shape=[32], data_offsets=[h[NORM]["data_offsets"][0], h[NORM]["data_offsets"][0] + 64])), None),
        "header length 2^40": (lambda f: open(os.path.join(f, ST), "r+b").write(struct.pack("<Q", 1 << 40)), ST),
        "header length past the file": (lambda f: open(os.path.join(f, ST), "r+b").write(struct.pack("<Q", 10**6)),
                                        ST),
        "weights empty": (raw_weights(b""), ST), "weights 5 bytes": (raw_weights(b"\x01\x02\x03\x04\x05"), ST),
        "weights truncated": (truncate_weights, ST),
        "weights a FIFO": (replace_with(ST, "fifo"), ST),
        "weights linked to /dev/zero": (replace_with(ST, "link", "/dev/zero"), ST),
        "weights linked outside the folder": (outside, ST),
        "weights a dangling link": (replace_with(ST, "link", "nowhere.safetensors"), ST),
        "a directory named like a shard": (replace_with("extra.safetensors", "dir"), "extra.safetensors"),
        "index weight_map a list": (index([ST]), "model.safetensors.index.json"),
        "index with a non-string file": (index(lambda f: {**dict.fromkeys(tensor_names(f), ST), NORM: 7}),
                                         "model.safetensors.index.json"),
        "index naming ../": (index(lambda f: dict.fromkeys(tensor_names(f), "../" + ST)), None),
        "index naming /etc/passwd": (index(lambda f: dict.fromkeys(tensor_names(f), "/etc/passwd")), None),
        "index naming a missing shard": (index(lambda f: dict.fromkeys(tensor_names(f), "other.safetensors")), None),
        "index not JSON": (write_text("model.safetensors.index.json", "{"), "model.safetensors.index.json"),
        "index a FIFO": (replace_with("model.safetensors.index.json", "fifo"), "model.safetensors.index.json"),
        "only a pickle": (pickle_only, None),
        "tokenizer.json garbage": (write_text(TOKENIZER, '{"model": "garbage"}'), TOKENIZER),
        "tokenizer.json not JSON": (write_text(TOKENIZER, "\x00{"), TOKENIZER),
        "tokenizer.json a FIFO": (replace_with(TOKENIZER, "fifo"), TOKENIZER),
        "tokenizer.json linked to /dev/zero": (replace_with(TOKENIZER, "link", "/dev/zero"), TOKENIZER),
        "tokenizer.json over 256 MiB (sparse)": (sparse(TOKENIZER, (256 << 20) + 1), TOKENIZER),
        "tokenizer.json missing": (lambda f: os.remove(os.path.join(f, TOKENIZER)), None),
        "generation_config garbage": (write_text("generation_config.json", "\x00garbage{"), "generation_config.json"),
        "generation_config a list": (write_text("generation_config.json", "[2, 0]"), "generation_config.json"),
        "generation_config eos an object": (write_text("generation_config.json", '{"eos_token_id": {"id": 2}}'),
                                            "generation_config.json"),
        "generation_config a FIFO": (replace_with("generation_config.json", "fifo"), "generation_config.json"),
        "chat template syntax error": (write_text("chat_template.jinja", "{% for m in messages %}\n{{ m }\n"),
                                       "chat_template.jinja"),
        "chat template a FIFO": (replace_with("chat_template.jinja", "fifo"), "chat_template.jinja"),
        "tokenizer_config chat_template 42": (lambda f: (os.remove(os.path.join(f, "chat_template.jinja")), edit_json(
            os.path.join(f, "tokenizer_config.json"), lambda c: c.update(chat_template=42))), "tokenizer_config.json"),
        "tokenizer_config not JSON, no chat_template.jinja": (lambda f: (os.remove(os.path.join(
            f, "chat_template.jinja")), write_text("tokenizer_config.json", "{")(f)), "tokenizer_config.json"),
    }


CONFIG_FIELDS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads",
                 "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "max_position_embeddings",
                 "rms_norm_eps", "tie_word_embeddings", "eos_token_id", "layer_types", "rope_parameters"]
CONFIG_VALUES = {"0": 0, "-1": -1, "2^40": 2**40, "1.5": 1.5, "a string": "x", "null": None, "a list": [1]}


def config_values() -> dict:
    """Each config field set to each odd value: refused naming config.json, or (a valid value) loaded."""
    found = {}
    for field in CONFIG_FIELDS:
        for name, value in CONFIG_VALUES.items():
            found[f"config {field} {name}"] = config_edit(lambda c, f=field, v=value: c.update({f: v}))
    for key, value in (("rope_theta", 0), ("rope_theta", -1.0), ("rope_theta", "x"), ("partial_rotary_factor", 2.0),
                       ("partial_rotary_factor", -0.5), ("partial_rotary_factor", 0), ("rope_type", "yarn"),
                       ("mrope_section", "x")):
        found[f"config rope_parameters.{key} {value!r}"] = config_edit(
            lambda c, k=key, v=value: c["rope_parameters"].update({k: v}))
    return found


def limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BOUND, MEMORY_BOUND))


def run_cli(folder, root) -> tuple:
    """(exit status or None on a timeout, stderr, seconds) of `tensorfold generate` on `folder`."""
    started = time.monotonic()
    command = [sys.executable, "-m", "tensorfold.cli", "generate", "--model", folder, "--prompt", "x",
               "--max-tokens", "1", "--backend", "numpy", "--drafter", "none"]
    env = {**os.environ, "PYTHONPATH": root, "HF_HUB_OFFLINE": "1"}
    try:
        run = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=TIME_BOUND,
                             preexec_fn=limit_memory)
        return run.returncode, run.stderr, time.monotonic() - started
    except subprocess.TimeoutExpired as e:
        return None, (e.stderr or b"").decode(errors="replace"), time.monotonic() - started


def judge(status, stderr, folder, names, may_load) -> tuple:
    errors = [line for line in stderr.splitlines() if "error:" in line]
    if status is None:
        return "hang", f"still running after {TIME_BOUND} s"
    if "Traceback" in stderr or "MemoryError" in stderr:
        return "traceback", stderr.strip().splitlines()[-1][:300] if stderr.strip() else ""
    if status == 0 and may_load:
        return "ok", "loaded"
    if status != 2 or len(errors) != 1 or not errors[0].startswith("tensorfold: error: "):
        return "not a one-line refusal", f"exit {status}: {stderr.strip()[-300:]}"
    if names and os.path.join(folder, names) not in errors[0]:
        return "file not named", errors[0][:300]
    return "ok", errors[0][:300]


def run_case(workdir, good, root, i, name, change, names, may_load) -> dict:
    folder = os.path.join(workdir, f"case{i:03d}")
    shutil.copytree(good, folder)
    change(folder)
    status, stderr, seconds = run_cli(folder, root)
    verdict, note = judge(status, stderr, folder, names, may_load)
    if name.startswith("the untouched") and status != 0:
        verdict = "the control did not load"
    if name == "only a pickle" and os.path.exists(os.path.join(workdir, "the pickle ran")):
        verdict = "the pickle ran"
    return {"group": "checkpoints", "name": name, "folder": folder, "status": status, "verdict": verdict,
            "note": note, "seconds": round(seconds, 3)}


def run_all(workdir, root, echo=print, workers=2) -> list:
    """Every folder, `workers` CLI runs at a time; each failure echoed as it comes."""
    sys.path.insert(0, root)
    from tensorfold.model.tiny import make_tiny
    os.makedirs(workdir, exist_ok=True)
    good = os.path.join(workdir, "good")
    make_tiny(good, seed=5)
    cases = [(name, change, names, False) for name, (change, names) in refusals().items()]
    cases += [(name, change, CONFIG, True) for name, change in config_values().items()]
    cases.append(("the untouched copy (the control)", lambda folder: None, None, True))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(run_case, workdir, good, root, i, *c) for i, c in enumerate(cases)]
        found = []
        for future in futures:
            found.append(future.result())
            if found[-1]["verdict"] != "ok":
                echo(f"    FAILED checkpoint {found[-1]['name']}: {found[-1]['verdict']} {found[-1]['note'][:200]}")
    return found


if __name__ == "__main__":
    import tempfile
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    results = run_all(tempfile.mkdtemp(prefix="tensorfold-checkpoints-"), here, echo=lambda line: None)
    for r in results:
        print(f"{r['verdict']:24} {r['status']!s:5} {r['name']}: {r['note'][:150]}", flush=True)
    failed = [r for r in results if r["verdict"] != "ok"]
    print(f"# {len(results)} folders, {len(failed)} failed")
    sys.exit(1 if failed else 0)
