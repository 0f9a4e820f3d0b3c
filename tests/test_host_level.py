"""Host-level plans chosen by stragg's defaults on 2 emulated hosts x 2 ranks (200 Mbit/s).

tests/scripts/host_level_rank.py runs all_reduces of 1 MiB with the defaults (the planner, the
profiler and the plan check decide; exchanges every 4 calls so that a short job reaches its
decisions):
- healthy: the host-level Ring (reduce-scatter in each host, the cross-host Ring on half the
  buffer per host mate, allgather in each host) is tried against the flat baseline on the same
  calls and kept; the last calls run host-level plans;
- rank 3 late (local rank 1 of host 1): the profiler adopts it, the plan check tries its plans
  against the running ones on the same calls (on 2 hosts a late rank's plans gain little: which
  arm wins is the measurement's, not asserted), and the last calls run host-level plans.
Every call's result equals the float64 reference exactly (integer-valued data) and is bitwise
identical on every rank. Timings are not asserted (benchmarks/training.py --nproc-per-node
measures them). Skips without network namespaces; FAILS then under STRAGG_TEST_REQUIRE=1.
"""

from __future__ import annotations

import json
import os
import sys

import _emu
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "scripts", "host_level_rank.py")
WORLD = 4
CALLS = 48

pytestmark = [pytest.mark.needs_backend, pytest.mark.stragg_only]


def _run(tmp_path, late: int, delay: float) -> list[dict]:
    emu = _emu.emucluster()
    env = {"OMP_NUM_THREADS": "1", "STRAGG_PROFILE_EVERY": "4", "STRAGG_PROBE_BUDGET": "0.5"}
    with emu.EmuCluster(hosts=2, rate="200mbit", name=_emu.new_name("hl")) as c:
        res = c.run([sys.executable, SCRIPT, str(tmp_path), str(CALLS), str(late), str(delay)],
                    nproc_per_node=2, env=env, timeout=300, fail_fast=False, output=None)
    results = []
    for r in range(WORLD):
        try:
            with open(os.path.join(tmp_path, f"rank{r}.json")) as f:
                results.append(json.load(f))
        except (OSError, ValueError):
            results.append({"rank": r, "ok": False, "error": "no result"})
    story = res.describe() + "\n" + json.dumps(results, indent=1)[:6000]
    assert not res.timed_out, story
    for r in results:
        assert r["ok"], story
        assert r["transport"] == "mixed", story
        assert all(r["exact"]), (r["rank"], r["exact"])
        assert r["plans"] == results[0]["plans"], "ranks ran different plans"
        assert r["plan_checks"] == results[0]["plan_checks"], "ranks decided differently"
    for i in range(CALLS):
        assert len({r["digests"][i] for r in results}) == 1, f"call {i}: ranks differ bitwise"
    return results


def test_healthy_hosts_run_the_host_level_plan(tmp_path) -> None:
    results = _run(tmp_path, -1, 0.0)
    r = results[0]
    checks = r["plan_checks"]
    # The first check measured the host-level plans ("plain": the model's choice) against the
    # flat baseline on the same calls, and kept them.
    assert checks and checks[0]["change"] == "plain", checks
    assert [a["mode"] for a in checks[0]["arms"]] == ["plain", "flat"], checks
    assert checks[0]["kept"], checks
    assert r["mode"] == "plain", r["mode"]
    tail = r["plans"][-8:]
    assert all(p.startswith("host:") for p in tail), r["plans"]


def test_a_late_rank_is_tried_with_host_level_plans(tmp_path) -> None:
    results = _run(tmp_path, 3, 0.03)
    r = results[0]
    assert any(d["straggler"] == 3 for d in r["decisions"]), r["decisions"]
    trials = [c for c in r["plan_checks"] if c["change"].startswith("straggler 3")]
    assert trials, r["plan_checks"]
    assert [a["mode"] for a in trials[0]["arms"]][:2] == ["straggler 3", "plain"], trials
    assert all(a["calls"] > 0 and a["error_s"] >= 0 for a in trials[0]["arms"]), trials
    assert trials[0]["rounds"] in (1, 2), trials
    # The straggler's arm ran host-level plans for rank 3; the last calls host-level plans.
    assert any(p.startswith("host:") and "(3" in p for p in r["plans"]), r["plans"]
    assert all(p.startswith("host:") for p in r["plans"][-8:]), r["plans"]
