"""The mixed transport on an emulated cluster: 2 hosts x 2 ranks (stragg.emucluster, unshaped).

Ranks 0, 1 run on host 0 and ranks 2, 3 on host 1 (tests/scripts/mixed_rank.py, one job):
- auto picks "mixed" on every rank: shared memory to the host mate, TCP to the other host;
- every algorithm (ring, rhd, direct, stragglar, optcc), flat and as a host-level plan
  (host_level=on), gives the exact result on integer data and results close to the float64
  reference on random data, bitwise identical on every rank;
- the dynamic straggler (agreed on the store board) is exact;
- a numel mismatch raises on every rank, naming it;
- rank 3 killed on host 1 is detected by every survivor, on either host, long before the
  process-group timeout.
Skips without network namespaces; FAILS then under STRAGG_TEST_REQUIRE=1 (CI runs as root).
"""

from __future__ import annotations

import json
import os
import sys

import _emu
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "scripts", "mixed_rank.py")
ALGOS = ("ring", "rhd", "direct", "stragglar", "optcc", "stragglar_direct")
HOST_LEVEL_ALGOS = ("ring", "rhd", "direct", "optcc", "stragglar_direct", "stragglar")
WORLD = 4

pytestmark = [pytest.mark.needs_backend, pytest.mark.stragg_only]


def _results(tmp: str, res) -> list[dict]:
    out = []
    for r in range(WORLD):
        try:
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                out.append(json.load(f))
        except (OSError, ValueError):
            out.append({"rank": r, "ok": False, "error": "no result"})
    return out


def test_two_hosts_of_two_ranks(tmp_path) -> None:
    emu = _emu.emucluster()
    with emu.EmuCluster(hosts=2, rate=None, name=_emu.new_name("m")) as c:
        env = {"OMP_NUM_THREADS": "1", "STRAGG_TRANSPORT": "auto"}
        res = c.run([sys.executable, SCRIPT, str(tmp_path)], nproc_per_node=2, env=env,
                    timeout=240, fail_fast=False, output=None)
    results = _results(str(tmp_path), res)
    story = res.describe() + "\n" + json.dumps(results, indent=1)[:6000]
    assert not res.timed_out, story
    for r in results:
        if r["rank"] != 3:
            assert r["ok"], story
        assert r.get("transport") == "mixed", story
        mate = r["rank"] ^ 1
        assert r["peer_transports"] == {
            str(q): "shm" if q == mate else "tcp" for q in range(WORLD) if q != r["rank"]
        }, story
        assert r["host_index"] == r["rank"] // 2, story

    for algo in ALGOS:
        runs = [r["algorithms"][algo] for r in results]
        for run in runs:
            assert run["ran"] == [algo], (algo, run)
            assert run["exact"], (algo, run)
            assert run["max_rel_err"] < 1e-5, (algo, run)
            assert run["digests"] == runs[0]["digests"], f"{algo}: ranks differ bitwise"

    for algo, runs in ((a, [r["host_level"][a] for r in results]) for a in HOST_LEVEL_ALGOS):
        for run in runs:
            assert run["ran"] == [algo], (algo, run)
            assert all(p.startswith(f"host:{algo}") for p in run["plans"]), (algo, run)
            assert run["exact"], (algo, run)
            assert run["max_rel_err"] < 1e-5, (algo, run)
            assert run["digests"] == runs[0]["digests"], f"host-level {algo}: ranks differ"

    dyn = [r["dynamic"] for r in results]
    assert all(d["exact"] and d["dynamic_calls"] == 1 for d in dyn), dyn
    assert len({d["digest"] for d in dyn}) == 1, dyn

    for r in results:
        assert "DistBackendError" in r["mismatch"] and "mismatch" in r["mismatch"], r["mismatch"]
        assert "numel" in r["mismatch"] or "aborted" in r["mismatch"], r["mismatch"]
    assert any("100 (rank 3)" in r["mismatch"] for r in results), story

    for r in results[:3]:
        kill = r["kill"]
        assert kill["first_sum"] == WORLD, kill
        assert kill["second"] != "completed", kill
        assert "rank 3" in kill["second"], f"rank {r['rank']} does not name rank 3: {kill}"
        # Found through the dead process (its sockets closed, its pid gone), not the 60 s timeout.
        assert kill["second_after_s"] < 20.0, kill
