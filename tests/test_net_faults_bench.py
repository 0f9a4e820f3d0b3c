"""benchmarks/net_faults.py, small: a flap does not end stragg's DDP job, and the JSON says so.

One run of the benchmark (4 emulated hosts at 200 Mbit/s, a small transformer, 8 steps, stragg
only, host 2's NIC out for 3 s after step 3 of rank 0): the fault-free job of the one-NIC shape
and the flap job both finish every step on every rank, the flap was injected after step 3, the
final loss equals the fault-free job's, and the JSON carries what the tables are made of.
Behaviour only: no timing is asserted (docs/benchmarks.md has the measured table). Skips
without network namespaces; FAILS then under STRAGG_TEST_REQUIRE=1 (CI runs as root).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import _emu
import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow, pytest.mark.needs_backend]


def test_net_faults_benchmark_flap_completes_every_step(tmp_path: Path) -> None:
    _emu.emucluster()  # skips (or fails under STRAGG_TEST_REQUIRE=1) without namespaces
    cmd = [
        sys.executable, str(REPO / "benchmarks" / "net_faults.py"),
        "--faults", "flap", "--backends", "stragg", "--steps", "8", "--fault-at", "3",
        "--flap-seconds", "3", "--rate", "200mbit", "--layers", "1", "--d-model", "128",
        "--vocab", "1024", "--model", "torch", "--timeout", "180",
        "--json", "--plot", str(tmp_path / "nf.png"),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(proc.stdout.splitlines()[-1])
    assert doc["benchmark"] == "net_faults"
    assert doc["config"]["fault_at"] == 3 and doc["config"]["steps"] == 8

    # The flap's cluster shape brings its fault-free job: healthy-1nic, then flap.
    assert [(j["fault"], j["backend"]) for j in doc["jobs"]] == [
        ("healthy-1nic", "stragg"), ("flap", "stragg")]
    for job in doc["jobs"]:
        assert sorted(r["rank"] for r in job["ranks"]) == [0, 1, 2, 3], job["fault"]
        for r in job["ranks"]:
            assert [s["step"] for s in r["steps"]] == list(range(1, 9)), (job["fault"], r)
            assert r["end"]["ok"], (job["fault"], r["end"])
        assert job["summary"]["completed"] and job["summary"]["died"] == []
    flap = doc["jobs"][1]
    (ev,) = flap["events"]
    assert ev["after_step"] == 3 and ev["rank0_steps"] >= 3 and "error" not in ev, ev
    assert "host 2" in ev["what"], ev
    assert not doc["jobs"][0]["events"]

    # The rows the tables print.
    assert set(doc["rows"]) == {"healthy-1nic", "flap"}
    row = doc["rows"]["flap"]["stragg"]
    assert row["completed"] == 1 and row["min_steps"] == 8
    assert row["loss_rel_diff"] is not None and row["loss_rel_diff"] <= 1e-5
    assert row["last_s"] is not None and row["stall_s"] is not None
    (st,) = row["stragg"]
    assert isinstance(st["counters_changed"], dict)
    assert sum(st["plans_after"].values()) >= 8 - 3, st["plans_after"]  # a call per step
    assert "best" in row["model"], row["model"]
    assert (tmp_path / "nf.png").stat().st_size > 10_000
