"""`tensorfold bench scan` on the CPU (the twin), or under --gpu the kernel: a window of each row count and its keep
timed, and bad row counts refused."""
import json

from tensorfold.cli.bench.checkpoint import bench_config
from tensorfold.cli.bench.scan import scan_inputs
from tensorfold.cli.main import main


def test_bench_scan_times_each_window(tmp_path, on_gpu):
    out = tmp_path / "scan.json"
    assert main(["bench", "scan", "--config", "tiny", "--rows", "1,5", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["gpu"] == on_gpu and [w["rows"] for w in results["windows"]] == [1, 5]
    assert all(w["seconds"] > 0 and w["seconds_per_row"] == w["seconds"] / w["rows"] and w["keep_seconds"] > 0
               for w in results["windows"])


def test_scan_inputs_have_the_configs_shapes_and_unit_keys():
    import numpy as np
    config = bench_config("tiny")
    state, q, k, v, decay, beta = scan_inputs(np.random.default_rng(0), 3, config)
    assert state.shape == (config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim)
    assert q.shape == k.shape == (3, config.linear_num_key_heads, config.linear_key_head_dim)
    np.testing.assert_allclose(np.linalg.norm(k, axis=-1), 1, rtol=1e-6)
    assert ((0 < decay) & (decay < 1)).all() and ((0 < beta) & (beta < 1)).all()


def test_bench_scan_refuses_a_row_count_below_one(capsys):
    assert main(["bench", "scan", "--config", "tiny", "--rows", "4,0"]) == 2
    assert "--rows must be positive" in capsys.readouterr().err
