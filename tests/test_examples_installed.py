"""Examples and benchmarks use the installed stragg, never the source tree.

The full check against a regular (non-editable) install of the wheel is scripts/check_installed.sh
(run by scripts/test.sh); these tests keep the scripts free of source-tree path insertions and run
one benchmark from a directory outside the tree.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = sorted([*REPO.glob("examples/**/*.py"), *REPO.glob("benchmarks/*.py")])


def _path_insertions(path: Path, root: Path = REPO) -> list[str]:
    """Lines that change sys.path or PYTHONPATH."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        text = ast.unparse(node) if isinstance(node, (ast.Call, ast.Assign, ast.Subscript)) else ""
        if text.startswith(("sys.path.insert", "sys.path.append", "sys.path.extend")) or (
            isinstance(node, ast.Subscript) and "'PYTHONPATH'" in text
        ):
            found.append(f"{path.relative_to(root)}:{node.lineno}: {text}")
    return found


def test_scripts_exist() -> None:
    names = {p.name for p in SCRIPTS}
    assert {"finetune.py", "allreduce.py", "_common.py"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_source_tree_on_the_path(script: Path) -> None:
    assert _path_insertions(script) == []


def test_detector_finds_insertions(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import os, sys\nsys.path.insert(0, 'python')\nenv = {}\nenv['PYTHONPATH'] = 'python'\n"
    )
    found = _path_insertions(bad, tmp_path)
    assert [f.split(":")[1] for f in found] == ["2", "4"], found


@pytest.mark.slow
@pytest.mark.needs_backend
@pytest.mark.stragg_only
def test_benchmark_runs_from_another_directory(tmp_path: Path) -> None:
    cmd = [
        sys.executable, str(REPO / "benchmarks" / "allreduce.py"), "--ranks", "2",
        "--sizes", "4KiB", "--iters", "3", "--warmup", "1", "--budget", "0", "--reps", "1",
        "--json",
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout)
    # OpenMPI's column joins where mpirun and mpi4py are installed (scripts/setup.sh).
    assert {r["backend"] for r in rows} - {"mpi"} == {"stragg", "gloo"}
    assert [r["transport"] for r in rows if r["backend"] == "stragg"] == ["shm"]
    # torch's dispatch floor (its `fake` backend) is measured next to stragg.
    assert [r["floor_s"] > 0 for r in rows if r["backend"] == "stragg"] == [True]
    # OpenMPI through torch's dispatch is measured next to OpenMPI.
    assert all(r["dispatch_s"] > 0 for r in rows if r["backend"] == "mpi")


@pytest.mark.parametrize("script", ["examples/finetune.py", "benchmarks/training.py"])
def test_training_scripts_refuse_sequences_too_short_to_predict(script: str, tmp_path: Path) -> None:
    """--seq 1 leaves no next token to predict: a usage error, before any rank starts."""
    proc = subprocess.run([sys.executable, str(REPO / script), "--seq", "1"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "--seq must be at least 2" in proc.stderr, proc.stderr[-3000:]


def test_degraded_benchmark_redraws_from_json(tmp_path: Path) -> None:
    """`degraded.py --from-json` prints the table and draws the figure of earlier runs, no cluster."""
    rows = json.loads((REPO / "docs" / "degraded.json").read_text())
    half = len(rows) // 2
    (tmp_path / "a.json").write_text(json.dumps(rows[:half]))
    (tmp_path / "b.json").write_text(json.dumps(rows[half:]))
    png = tmp_path / "d.png"
    cmd = [
        sys.executable, str(REPO / "benchmarks" / "degraded.py"),
        "--from-json", f"{tmp_path / 'a.json'},{tmp_path / 'b.json'}", "--plot", str(png),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    # One line per row (both files), then the summary.
    assert sum(1 for ln in lines if ln.split() and ln.split()[0] in {"4", "5", "8"}) == len(rows)
    assert any(ln.startswith("# auto/bound: median") for ln in lines), proc.stdout
    assert png.stat().st_size > 10_000
