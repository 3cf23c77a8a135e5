"""`tensorfold bench experts` on the CPU (the twin) or under --gpu the grouped kernels, its routings and the experts
a call reads."""
import json
import subprocess
import sys

import numpy as np
import pytest

from tensorfold.cli.bench.experts import random_routing, touched
from tensorfold.cli.main import main
from tensorfold.model.tiny import TINY_MOE_CONFIG


def test_bench_experts_times_each_row_count(tmp_path, on_gpu):
    out = tmp_path / "experts.json"
    args = ["bench", "experts", "--config", "tiny-moe", "--rows", "1,3", "--repeats", "1", "--routings", "2",
            "--copy-mib", "64", "--json", str(out)]
    assert main(args) == 0
    results = json.loads(out.read_text())
    assert results["gpu"] == on_gpu
    k, experts = TINY_MOE_CONFIG.num_experts_per_tok, TINY_MOE_CONFIG.num_experts
    assert [s["rows"] for s in results["shapes"]] == [1, 3]
    for s in results["shapes"]:  # the tiny config's shared expert is as wide as a routed one: folded in, one pair more
        assert s["pairs"] == s["rows"] * (k + 1)
        assert k + 1 <= s["experts_read"] <= experts + 1 and s["seconds"] > 0 and s["bytes"] > 0


def test_a_routing_takes_distinct_experts_and_counts_what_it_reads():
    ids = random_routing(np.random.default_rng(0), 5, 8, 3)
    assert ids.shape == (5, 3) and ids.dtype == np.int32
    assert all(len(set(row)) == 3 for row in ids.tolist()) and ids.min() >= 0 and ids.max() < 8
    assert touched(np.array([[0, 1], [1, 2]]), shared=True) == 4
    assert touched(np.array([[0, 1], [1, 2]]), shared=False) == 3


@pytest.mark.parametrize("bad, named", [(["--config", "2B"], "not an MoE size"), (["--rows", "0"], "positive"),
                                        (["--routings", "0"], "positive")])
def test_bench_experts_refuses_what_it_cannot_run(bad, named, capsys):
    assert main(["bench", "experts", "--config", "tiny-moe", *bad]) == 2
    assert named in capsys.readouterr().err


def test_building_the_command_line_imports_no_numba():
    """`tensorfold contract` chooses numba's simulator before numba is first imported: building the parser, which
    lists every bench's options (the MoE sizes among them), must not import it."""
    code = "import sys; from tensorfold.cli.main import parser; parser(); print('numba' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "False"
