"""`tensorfold bench experts` on the CPU (the twin) or under --gpu the grouped kernels, its routings and the experts
a call reads."""
import json

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


@pytest.mark.parametrize("bad", [["--config", "2B"], ["--rows", "0"], ["--routings", "0"]])
def test_bench_experts_refuses_what_it_cannot_run(bad, capsys):
    try:
        status = main(["bench", "experts", "--config", "tiny-moe", *bad])
    except SystemExit as exit_:  # argparse: a dense size is not among the choices
        status = exit_.code
    assert status == 2
    assert "experts" in capsys.readouterr().err
