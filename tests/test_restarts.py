"""torchrun --max-restarts: a rank fails in the first attempt, the agent restarts every worker,
and the restarted attempt initializes with plain env:// init_process_group on the same agent
store (stragg's and the inner Gloo's keys live under a per-attempt prefix, so the stale keys of
the failed attempt are never read) and then runs correctly. (Plain Gloo fails here: its
restarted attempt reads the failed one's keys.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import _harness as h
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.needs_backend]

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "restart_once.py")
TIMEOUT_S = 300


def _processes_tagged(tag: str) -> list[int]:
    """Live processes whose environment holds STRAGG_TEST_RUN_TAG=tag (torchrun's workers run in
    sessions of their own and outlive a killed agent)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if f"STRAGG_TEST_RUN_TAG={tag}".encode() in fh.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


def _torchrun(args: list[str], env: dict[str, str], log: Path) -> tuple[int | None, str]:
    """Runs torchrun (output to `log`); after TIMEOUT_S every process of the run is killed."""
    tag = uuid.uuid4().hex
    env = {**env, "STRAGG_TEST_RUN_TAG": tag}
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            code: int | None = proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            for pid in _processes_tagged(tag):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()
            time.sleep(0.1)
    return code, log.read_text(encoding="utf-8", errors="replace")


@pytest.mark.stragg_only
@pytest.mark.parametrize("rdzv", ["default", "standalone"])
def test_a_restarted_attempt_initializes_and_runs(tmp_path: Path, rdzv: str) -> None:
    env = dict(os.environ)
    env.update(STRAGG_TEST_BACKEND=h.backend_name(), STRAGG_TEST_RESULT_DIR=str(tmp_path))
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    args = ["--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.2"]
    log = tmp_path / "torchrun.log"
    if rdzv == "standalone":  # the c10d rendezvous, on a port its store picks
        code, out = _torchrun([*args, "--standalone", SCRIPT], env, log)
    else:  # torchrun's default, the static rendezvous: its store listens on the port held here
        with h.reserved_ports() as (port,):
            code, out = _torchrun([*args, "--master-port", str(port), SCRIPT], env, log)
    story = f"torchrun exited {code} (None: killed after {TIMEOUT_S} s):\n{out[-6000:]}"
    assert code == 0, story
    assert "exitcode  : 3" in out or "exitcode: 3" in out, f"the first attempt did not fail: {story}"
    results = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(tmp_path.glob("attempt*.json"))]
    assert [(r["attempt"], r["rank"]) for r in results] == [(1, 0), (1, 1)], story
    for r in results:
        assert r["sums_ok"] and r["world_size"] == 2 and r["backend"] == h.backend_name(), r
