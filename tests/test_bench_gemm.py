"""`tensorfold bench gemm` on the CPU (the twin) or under --gpu the kernels, and the copies that keep a GPU's timed
weights out of its cache."""
import json

from tensorfold.cli.bench.gemm import weight_copies
from tensorfold.cli.main import main


def test_bench_gemm_times_every_projection(tmp_path, on_gpu):
    out = tmp_path / "gemm.json"
    small = ["--cold-mib", "0", "--copy-mib", "64"]  # on a GPU: one copy of each weight, a small bandwidth bar
    args = ["bench", "gemm", "--config", "tiny", "--rows", "1,3", "--repeats", "1", *small, "--json", str(out)]
    assert main(args) == 0
    results = json.loads(out.read_text())
    assert results["gpu"] == on_gpu
    shapes = results["shapes"]
    assert [s["rows"] for s in shapes] == [1, 3] * (len(shapes) // 2) and shapes[-1]["projection"] == "lm_head"
    assert all(s["copies"] == 1 and s["seconds"] > 0 for s in shapes)  # one weight, once: the twin's, or --cold-mib 0


def test_weight_copies_fill_the_bytes_asked_for():
    assert weight_copies(4 << 20, 256 << 20) == 64
    assert weight_copies(3 << 20, 256 << 20) == 86  # 86 * 3 MiB >= 256 MiB > 85 * 3 MiB
    assert weight_copies(318 << 20, 256 << 20) == 1  # a weight larger than the bytes asked for: itself
    assert weight_copies(4 << 20, 0) == 1  # none asked for: one copy, warm in the cache
