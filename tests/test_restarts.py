"""torchrun --max-restarts: a rank fails in the first attempt, the agent restarts every worker,
and the restarted attempt initializes with plain env:// init_process_group on the same agent
store (stragg's and the inner Gloo's keys live under a per-attempt prefix, so the stale keys of
the failed attempt are never read) and then runs correctly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import _harness as h
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.needs_backend]

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "restart_once.py")
TIMEOUT_S = 300


def _torchrun(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Runs torchrun in its own session; on timeout the whole session (workers too) is killed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish within {TIMEOUT_S} s:\n{out[-5000:]}")
    return proc.returncode, out


@pytest.mark.parametrize("rdzv", ["default", "standalone"])
def test_a_restarted_attempt_initializes_and_runs(tmp_path: Path, rdzv: str) -> None:
    env = dict(os.environ)
    env.update(STRAGG_TEST_BACKEND=h.backend_name(), STRAGG_TEST_RESULT_DIR=str(tmp_path))
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    args = ["--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.2"]
    if rdzv == "standalone":
        args.append("--standalone")
    code, out = _torchrun([*args, SCRIPT], env)
    story = f"torchrun exited {code}:\n{out[-6000:]}"
    assert code == 0, story
    assert "exitcode  : 3" in out or "exitcode: 3" in out, f"the first attempt did not fail: {story}"
    results = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(tmp_path.glob("*.json"))]
    assert [(r["attempt"], r["rank"]) for r in results] == [(1, 0), (1, 1)], story
    for r in results:
        assert r["sums_ok"] and r["world_size"] == 2 and r["backend"] == h.backend_name(), r
