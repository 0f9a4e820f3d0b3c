"""Ranks on two emulated hosts: a stragg.emucluster cluster of two network namespaces on a bridge.

Every test makes its own cluster ("n<pid>x<k>", see tests/_emu.py): host i is namespace
emu-n<pid>x<k>-h<i> with eth0 at 10.77.0.<i+1>/24, an address that exists only inside it
(nothing else is reachable from there: no default route). Optionally both directions of each
host link are rate-limited with tc. The cluster, and every rank process with it, is torn down by
the fixture, also when a test fails.

Ranks alternate between the hosts (rank r lives on host r % 2), so every ring hop crosses the
bridge. Rank 0's host address is MASTER_ADDR (the TCPStore). Each rank runs
tests/scripts/netns_rank.py inside its host's namespace with RANK / WORLD_SIZE / MASTER_ADDR /
MASTER_PORT set by the cluster.

Checks: ranks in different namespaces are not treated as one host (transport is not "shm":
"tcp", or "mixed" with two ranks per host; with STRAGG_TRANSPORT=tcp it is "tcp"), all_reduce
results match a reference and are bitwise identical across ranks, and a rank killed on the other
host is detected promptly.

Skips (with the reason) when namespaces cannot be created; FAILS then under STRAGG_TEST_REQUIRE=1.
"""

from __future__ import annotations

import json
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

import _emu
import _harness
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
RANK_SCRIPT = os.path.join(HERE, "scripts", "netns_rank.py")
STORE_PORT = 29517  # free: the namespaces are new
RUN_TIMEOUT_S = 300.0

pytestmark = [pytest.mark.slow, pytest.mark.needs_backend]


@pytest.fixture
def two_hosts(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Any]:
    """An unshaped two-host cluster (indirect parametrization: EmuCluster keyword arguments)."""
    emu = _emu.emucluster()
    kw = {"hosts": 2, "rate": None, **getattr(request, "param", {})}
    with emu.EmuCluster(name=_emu.new_name("n"), **kw) as cluster:
        yield types.SimpleNamespace(cluster=cluster, workdir=str(tmp_path))


def _run(
    hosts: Any, world: int, mode: str, transport: str | None, advertise: bool = True
) -> tuple[list[dict], list[str]]:
    """Runs `world` ranks across the two hosts; returns their JSON results and outputs.

    advertise=False leaves STRAGG_TCP_HOST unset: the backend must find the rank's address
    itself (the local address that routes to the store host).
    """
    from stragg.emucluster import ProcSpec

    cluster, tag = hosts.cluster, f"{mode}-{transport}-{world}"
    outs = [os.path.join(hosts.workdir, f"{tag}-rank{r}.json") for r in range(world)]
    specs = []
    for r in range(world):
        host = cluster.host(r % 2)
        extra = {"OMP_NUM_THREADS": "1"}
        if advertise:
            extra["STRAGG_TCP_HOST"] = host.addr  # the address stragg's TCP transport advertises
        env = cluster.env(host.rank, r, world, r // 2, (world + 1) // 2, STORE_PORT, extra)
        env.pop("STRAGG_TRANSPORT", None)
        if transport is not None:
            env["STRAGG_TRANSPORT"] = transport
        if not advertise:
            env.pop("STRAGG_TCP_HOST", None)
        argv = [sys.executable, RANK_SCRIPT, outs[r], mode]
        specs.append(ProcSpec(f"rank{r}", host.rank, argv, env))
    # fail_fast=False: in "kill" mode one rank dies on purpose and rank 0 must report it.
    job = cluster.launch(specs, output=None)
    done = job.wait(timeout=RUN_TIMEOUT_S, fail_fast=False)
    results = []
    for r in range(world):
        try:
            with open(outs[r]) as f:
                results.append(json.load(f))
        except (OSError, ValueError):
            results.append({"rank": r, "ok": False, "error": "no result (died or hung)"})
    if done.timed_out:
        hung = [int(label[4:]) for label in done.killed]
        pytest.fail(
            f"ranks {hung} did not finish within {RUN_TIMEOUT_S} s\n"
            + _story(results, done.outputs)
        )
    return results, done.outputs


def _story(results: list[dict], outputs: list[str]) -> str:
    parts = []
    for res, out in zip(results, outputs):
        parts.append(
            f"--- rank {res.get('rank')}: ok={res.get('ok')} stage={res.get('stage')} "
            f"error={res.get('error')}\n{res.get('traceback', '')}"
        )
        tail = out[-3000:]
        if tail.strip():
            parts.append(f"    output tail:\n{tail}")
    return "\n".join(parts)


def _check_results(results: list[dict], logs: list[str]) -> None:
    story = _story(results, logs)
    assert all(r["ok"] for r in results), story
    for res in results:
        bad = [c for c in res["cases"] if not c["ok"]]
        assert not bad, f"rank {res['rank']}: wrong results: {bad}"
    first = results[0]["cases"]
    for res in results[1:]:
        for mine, theirs in zip(res["cases"], first):
            assert mine["case"] == theirs["case"]
            assert mine["sha256"] == theirs["sha256"], (
                f"{mine['case']}: rank {res['rank']} differs bitwise from rank 0"
            )


def _transports(results: list[dict]) -> list[str]:
    return [r["stats_before"]["transport"] for r in results]


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_in_two_namespaces_are_not_one_host(two_hosts: Any, world: int) -> None:
    """STRAGG_TRANSPORT unset (auto): never shared memory across hosts (TCP with one rank per
    host, the mixed transport with two: shared memory only to the host mate); results correct."""
    results, logs = _run(two_hosts, world, "check", transport=None)
    _check_results(results, logs)
    if _harness.is_stragg():
        transports = _transports(results)
        assert transports == ["tcp" if world == 2 else "mixed"] * world, transports
        for res in results:
            peers = res["stats_before"]["peer_transports"]
            r = res["rank"]
            expected = {str(q): "shm" if q % 2 == r % 2 else "tcp" for q in range(world) if q != r}
            assert peers == expected, (r, peers)


@pytest.mark.stragg_only
@pytest.mark.parametrize("world", [2, 4])
def test_tcp_transport_across_namespaces(two_hosts: Any, world: int) -> None:
    results, logs = _run(two_hosts, world, "check", transport="tcp")
    _check_results(results, logs)
    assert _transports(results) == ["tcp"] * world
    for res in results:
        ran = res["stats_after"]["allreduce_calls"] - res["stats_before"]["allreduce_calls"]
        assert ran == len(res["cases"]), f"rank {res['rank']}: not run on stragg's executor: {res}"


@pytest.mark.stragg_only
def test_tcp_transport_finds_its_address_without_stragg_tcp_host(two_hosts: Any) -> None:
    results, logs = _run(two_hosts, 2, "check", transport="tcp", advertise=False)
    _check_results(results, logs)
    assert _transports(results) == ["tcp", "tcp"]


@pytest.mark.stragg_only
@pytest.mark.parametrize("two_hosts", [{"rate": "800mbit"}], indirect=True)
def test_tcp_transport_over_a_rate_limited_link(two_hosts: Any) -> None:
    results, logs = _run(two_hosts, 2, "check", transport="tcp")
    _check_results(results, logs)
    assert _transports(results) == ["tcp", "tcp"]


@pytest.mark.stragg_only
@pytest.mark.parametrize("transport", [None, "tcp"])
def test_rank_killed_on_the_other_host_is_detected(two_hosts: Any, transport: str | None) -> None:
    results, logs = _run(two_hosts, 2, "kill", transport=transport)
    story = _story(results, logs)
    survivor = results[0]
    assert survivor["ok"], story
    assert survivor["first_sum"] == 2.0, story
    assert survivor["second"] != "completed", story
    # Detected through the closed connection, long before the 120 s process-group timeout.
    assert survivor["second_after_s"] < 20.0, story
    if transport == "tcp":
        assert "1 has died" in survivor["second"], story
