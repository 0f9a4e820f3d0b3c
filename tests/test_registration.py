"""Registration of backend "stragg": explicit import (idempotent), PyTorch extension autoload
(entry point group "torch.backends"), and torchrun with a script that never imports stragg.

Each check runs in a fresh interpreter so that registration state cannot leak between checks.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import _harness as h
import pytest

pytestmark = pytest.mark.needs_backend

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")
TORCHRUN_SCRIPT = os.path.join(SCRIPTS, "torchrun_no_import.py")
REGISTRATION_SCRIPT = os.path.join(SCRIPTS, "check_registration.py")


def _env(**extra: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def _run(
    args: list[str], timeout_s: float, **extra_env: str | None
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=_env(**extra_env),
            check=False,
        )
    except subprocess.TimeoutExpired as exc:  # subprocess.run kills the child on timeout
        out = [
            x.decode(errors="replace") if isinstance(x, bytes) else x
            for x in (exc.stdout, exc.stderr)
        ]
        pytest.fail(
            f"{' '.join(args)} did not finish within {timeout_s}s; output:\n{out[0]}\n{out[1]}"
        )


def _results(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [
        json.loads(line[len("RESULT ") :])
        for line in proc.stdout.splitlines()
        if line.startswith("RESULT ")
    ]


def _one_result(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    res = _results(proc)
    assert len(res) == 1, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "error" not in res[0], (
        f"{res[0]['error']}\n{res[0].get('traceback', '')}\nstderr:\n{proc.stderr}"
    )
    return res[0]


def _assert_registered(state: dict[str, Any], label: str) -> None:
    assert state["in_backend_list"], f"{label}: 'stragg' not in dist.Backend.backend_list"
    assert state["count_in_backend_list"] == 1, (
        f"{label}: registered {state['count_in_backend_list']} times"
    )
    assert {"cpu", "cuda"} <= set(state["capability"]), f"{label}: devices {state['capability']}"


def _assert_single_rank_group_works(res: dict[str, Any]) -> None:
    assert res["get_backend"] == "stragg"
    assert res["allreduce_ws1"] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert res["stats"]["transport"] == "local", res["stats"]
    assert res["stats"]["allreduce_calls"] == 1, res["stats"]


@pytest.mark.stragg_only
def test_import_registers_cpu_and_cuda_idempotently() -> None:
    proc = _run([sys.executable, REGISTRATION_SCRIPT, "import"], timeout_s=120)
    res = _one_result(proc)
    assert proc.returncode == 0, proc.stderr
    for key in ("after_import", "after_reload", "after_register"):
        _assert_registered(res[key], key)
    _assert_single_rank_group_works(res)


@pytest.mark.stragg_only
def test_import_stragg_first_is_quiet() -> None:
    """``import stragg`` before torch in a fresh interpreter: no traceback, no warning on stderr."""
    proc = _run([sys.executable, "-c", "import stragg; print('imported')"], timeout_s=120)
    assert proc.returncode == 0, proc.stderr
    assert "imported" in proc.stdout
    noise = [
        ln for ln in proc.stderr.splitlines() if re.search(r"Traceback|Error|autoload failed", ln)
    ]
    assert not noise, "import stragg printed errors on stderr:\n" + proc.stderr


@pytest.mark.stragg_only
def test_entry_point_declared() -> None:
    eps = [ep for ep in metadata.entry_points(group="torch.backends") if ep.name == "stragg"]
    assert len(eps) == 1, (
        f"torch.backends entry points: {list(metadata.entry_points(group='torch.backends'))}"
    )
    assert eps[0].value.split(":")[0].split(".")[0] == "stragg", eps[0].value
    assert callable(eps[0].load())


@pytest.mark.stragg_only
def test_autoload_registers_without_import() -> None:
    proc = _run([sys.executable, REGISTRATION_SCRIPT, "autoload"], timeout_s=120)
    res = _one_result(proc)
    _assert_registered(res["after_import_torch"], "after import torch")
    _assert_single_rank_group_works(res)


@pytest.mark.stragg_only
def test_autoload_disabled_means_not_registered() -> None:
    """Control: with torch's autoload switched off, nothing else registers stragg."""
    code = "import sys, torch.distributed as d; print('stragg' in d.Backend.backend_list, 'stragg' in sys.modules)"
    proc = _run([sys.executable, "-c", code], timeout_s=120, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"], proc.stdout


def test_torchrun_script_never_imports_stragg() -> None:
    with open(TORCHRUN_SCRIPT, encoding="utf-8") as fh:
        source = fh.read()
    assert not re.search(r"^\s*(import\s+stragg|from\s+stragg)", source, re.MULTILINE)
    assert "importlib" not in source and "__import__" not in source


@pytest.mark.slow
def test_torchrun_four_ranks_without_import(tmp_path: Path) -> None:
    proc = _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "4",
            TORCHRUN_SCRIPT,
        ],
        timeout_s=240,
        STRAGG_TEST_BACKEND=h.backend_name(),
        STRAGG_TEST_RESULT_DIR=str(tmp_path),
    )
    results = [
        json.loads(p.read_text(encoding="utf-8")) for p in sorted(tmp_path.glob("rank*.json"))
    ]
    story = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-5000:]}"
    assert proc.returncode == 0, story
    assert sorted(r["rank"] for r in results) == [0, 1, 2, 3], story
    for r in results:
        assert r["ok"], f"rank {r['rank']}: {r}"
        assert r["world_size"] == 4 and r["backend"] == h.backend_name(), r
        assert r["sum_ok"] and r["max_ok"] and r["broadcast_ok"], r
        if h.is_stragg():
            assert r["module_loaded_by_autoload"], r
            assert r["stats"]["transport"] == "shm", r
