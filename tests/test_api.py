"""The public API and the `tensorfold` command."""
import re

import numpy as np
import pytest

import tensorfold
from tensorfold import api
from tensorfold.cli.main import main, serve_main
from tensorfold.engine import Engine, SamplingParams
from tensorfold.errors import BackendError, TensorfoldError


@pytest.fixture(scope="module")
def model(tiny_hf):
    return tensorfold.load(tiny_hf, backend="numpy")


def test_greedy_generate_is_the_argmax_of_the_prompt_pass(model):
    prompt = model.tokenizer.encode("Shall I compare thee")
    out = model.generate(prompt, 12, stop_ids=())
    ids = list(prompt)
    for _ in range(12):
        ids.append(int(np.argmax(model.logits(ids)[-1])))
    assert out == ids[len(prompt):]


def test_seeded_generate_is_reproducible(model):
    prompt = model.tokenizer.encode("To be, or not")
    a = model.generate(prompt, 16, temperature=1.0, top_p=0.9, seed=5, stop_ids=())
    assert a == model.generate(prompt, 16, temperature=1.0, top_p=0.9, seed=5, stop_ids=())
    assert a != model.generate(prompt, 16, temperature=1.0, top_p=0.9, seed=6, stop_ids=())
    assert len(a) == 16


def test_stop_ids_end_generation(model):
    prompt = model.tokenizer.encode("Hello")
    free = model.generate(prompt, 8, stop_ids=())
    assert model.generate(prompt, 8, stop_ids=[free[3]]) == free[:free.index(free[3])]
    assert set(model.tokenizer.stop_ids) == {model.tokenizer.encode("<|im_end|>")[0],
                                               model.tokenizer.encode("<|endoftext|>")[0]}


@pytest.mark.parametrize("kwargs, message", [
    ({"ids": []}, "prompt is empty"),
    ({"ids": [10**6]}, "token id 1000000 is outside the vocabulary"),
    ({"ids": [1, 2.5]}, "token ids must be integers, got 2.5"),
    ({"temperature": -1.0}, "temperature must be between 0 and 100, got -1.0"),
    ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
    ({"max_tokens": 10**7}, "maximum context length is 4096 tokens"),
])
def test_bad_requests_are_refused_by_name(model, kwargs, message):
    args = {"ids": [1, 2, 3], "max_tokens": 4, **kwargs}
    with pytest.raises(TensorfoldError, match=re.escape(message)):
        model.generate(**args)


REFUSED = [  # (fields, words of the refusal)
    ({"max_tokens": 0}, "max_tokens must be a positive integer"),
    ({"max_tokens": 2.0}, "max_tokens must be a positive integer"),
    ({"temperature": -0.5}, "temperature must be between 0 and 100"),
    ({"temperature": 100.5}, "temperature must be between 0 and 100"),
    ({"temperature": float("nan")}, "temperature must be between 0 and 100"),
    ({"top_p": 0.0}, "top_p must be in (0, 1]"),
    ({"top_p": 1.5}, "top_p must be in (0, 1]"),
    ({"top_k": -1}, "top_k must be an integer"),
    ({"top_k": 2**31}, "top_k must be an integer"),
    ({"min_p": 1.5}, "min_p must be in [0, 1]"),
    ({"seed": 2**64}, "seed must be an integer"),
    ({"seed": 1.5}, "seed must be an integer"),
]
ACCEPTED = [{"max_tokens": 1}, {"temperature": 100}, {"top_p": 1.0}, {"top_k": 2**31 - 1}, {"min_p": 1.0},
            {"seed": -2**63}, {"seed": 2**64 - 1}]  # the edges of each range


def refusal(call) -> str | None:
    try:
        call()
    except TensorfoldError as e:
        return str(e)
    return None


def disagreements(model, cases) -> list:
    """The cases where Model.generate and Engine.submit answer differently (one refuses and the other does not, or
    in other words), or where the answer is not the one expected (None: accepted)."""
    found = []
    for fields, words in cases:
        args = {"max_tokens": 2, "stop_ids": (), **fields}
        through_model = refusal(lambda args=args: model.generate([1, 2, 3], **args))
        engine = Engine(model, parallel=1, context=64)
        through_engine = refusal(lambda args=args, engine=engine: engine.submit([1, 2, 3], SamplingParams(**args)))
        expected = through_model is None if words is None else words in (through_model or "")
        if through_model != through_engine or not expected:
            found.append((fields, through_model, through_engine))
    return found


def test_model_generate_and_the_engine_share_one_validator(model):
    assert disagreements(model, REFUSED + [(fields, None) for fields in ACCEPTED]) == []


def test_control_a_validator_of_its_own_is_caught(model, monkeypatch):
    """Planted: Model.generate with a looser check than the engine's (no upper bound on temperature),
    so 100.5 is refused only by the engine."""
    class Looser(SamplingParams):
        def problems(self):
            found = super().problems()
            if self.temperature > 100:
                found.pop("temperature")
            return found
    monkeypatch.setattr(api, "SamplingParams", Looser)
    assert [fields for fields, *_ in disagreements(model, REFUSED)] == [{"temperature": 100.5}]


def test_a_negative_seed_draws_as_its_value_modulo_2_to_the_64(model):
    prompt = model.tokenizer.encode("To be")
    assert model.generate(prompt, 8, temperature=1.0, seed=-5, stop_ids=()) == \
        model.generate(prompt, 8, temperature=1.0, seed=2**64 - 5, stop_ids=())


def test_backends():
    with pytest.raises(BackendError, match="unknown backend 'tpu'"):
        tensorfold.load(".", backend="tpu")


def test_cuda_backend_without_a_gpu_is_a_clear_error():
    """Outside the simulator, backend "cuda" on a machine without a usable GPU names the problem."""
    import os
    import subprocess
    import sys
    script = ("from numba import cuda\n"
              "from tensorfold.backends import make_backend\n"
              "try:\n    print(make_backend('cuda').name, cuda.is_available())\n"
              "except Exception as e:\n    print(type(e).__name__, e, cuda.is_available())\n")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         check=False).stdout
    if out.strip().endswith("False"):
        assert out.startswith("BackendError backend 'cuda': no usable CUDA GPU here")
    else:
        assert out.startswith("cuda True")


def test_cli_make_tiny_and_generate(tmp_path, capsys):
    assert main(["make-tiny", str(tmp_path / "m"), "--format", "mlx4", "--seed", "2"]) == 0
    assert "wrote a random" in capsys.readouterr().out
    assert main(["generate", "--model", str(tmp_path / "m"), "--prompt", "ROMEO:", "--max-tokens", "5",
                 "--backend", "numpy"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("ROMEO:") and "generated" in out.err
    assert main(["generate", "--model", str(tmp_path / "m"), "--chat", "Hi", "--max-tokens", "3",
                 "--temperature", "0.7", "--seed", "1"]) == 0


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["generate", "--model", str(tmp_path / "absent"), "--prompt", "x"]) == 2
    assert "error: model" in capsys.readouterr().err
    assert main(["serve", "--model", str(tmp_path / "absent")]) == 2  # `tensorfold serve` passes its flags on
    assert serve_main(["--drafter", "some/folder"]) == 2


def test_load_without_a_model_is_the_embedded_one():
    from tensorfold.models import DEFAULT_MODEL
    assert tensorfold.load(backend="numpy").path == tensorfold.load(None, backend="numpy").path == DEFAULT_MODEL


TEST_EXTRA = ("httpx", "openai", "hypothesis", "torch", "transformers", "pytest")


def test_the_command_line_needs_no_test_extra(tmp_path):
    """`pip install .` without `.[test]`: with every package of the test extra unimportable, the commands that need
    no server still run. The planted control is the script's own check that the block holds."""
    import subprocess
    import sys
    script = "\n".join([
        "import sys",
        f"for name in {TEST_EXTRA!r}:",
        "    sys.modules[name] = None  # importing it now fails",
        "try:",
        "    import httpx",
        "except ImportError:",
        "    pass",
        "else:",
        "    raise SystemExit('control: the block does not hold')",
        "from tensorfold.cli.main import main",
        "for argv in (['--help'], ['bench', '--help'], ['bench', 'decode', '--help'], ['serve', '--help']):",
        "    try:",
        "        main(argv)",
        "    except SystemExit as e:",
        "        assert e.code == 0, argv",
        f"assert main(['make-tiny', {str(tmp_path / 'tiny')!r}]) == 0",
        "assert main(['generate', '--prompt', 'ROMEO:', '--max-tokens', '2', '--backend', 'numpy']) == 0"])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage: tensorfold" in done.stdout and "wrote a random" in done.stdout


def test_bench_without_a_server_is_a_one_line_error(capsys):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens on it once the socket closes
    assert main(["bench", "openai", "--url", f"http://127.0.0.1:{port}"]) == 2
    assert "no tensorfold-serve answers at" in capsys.readouterr().err
