"""The public API and the `tensorfold` command."""
import numpy as np
import pytest

import tensorfold
from tensorfold.cli.main import main, serve_main
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
    ({"temperature": -1.0}, "temperature=-1.0"),
    ({"top_p": 0.0}, "top_p=0.0"),
    ({"max_tokens": 10**7}, "maximum context length is 4096 tokens"),
])
def test_bad_requests_are_refused_by_name(model, kwargs, message):
    args = {"ids": [1, 2, 3], "max_tokens": 4, **kwargs}
    with pytest.raises(TensorfoldError, match=message):
        model.generate(**args)


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
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True).stdout
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
