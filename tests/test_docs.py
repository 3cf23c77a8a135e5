"""The tutorials run and check themselves, and the documentation builds without a single warning."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = sorted((ROOT / "tutorials").glob("*.py"))


def test_there_are_tutorials():
    assert TUTORIALS, "tutorials/ holds no scripts"


@pytest.mark.parametrize("script", TUTORIALS, ids=[t.name for t in TUTORIALS])
def test_tutorial_runs(script):
    """Each tutorial is a plain script that exits non-zero when one of its checks fails."""
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{script.name} exited with {done.returncode}:\n{done.stdout}\n{done.stderr}"


def test_docs_build_without_warnings(tmp_path):
    """`sphinx-build -W`: a warning (a renamed function under literalinclude, a broken docstring) fails the build."""
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-d", str(tmp_path / "doctrees"),
               str(ROOT / "docs"), str(tmp_path / "html")]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"sphinx-build failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr}"
    assert (tmp_path / "html" / "index.html").exists()
