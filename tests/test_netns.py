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
host is detected promptly. Faults on the TCP transport: a stopped rank, a mismatch, a cut link
(policy routing drops one connection), an absent rank and strangers on a rank's port are each
reported as docs/faults.md says, naming the right rank or link.

Skips (with the reason) when namespaces cannot be created; FAILS then under STRAGG_TEST_REQUIRE=1.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
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


@dataclasses.dataclass
class Started:
    job: Any
    ranks: list[int]
    outs: list[str]


def _start(
    hosts: Any,
    world: int,
    mode: str,
    transport: str | None,
    advertise: bool = True,
    env: dict[str, str] | None = None,
    ranks: list[int] | None = None,
) -> Started:
    """Starts `ranks` (default all) of `world` across the two hosts, with extra `env`.

    advertise=False leaves STRAGG_TCP_HOST unset: the backend must find the rank's address
    itself (the local address that routes to the store host).
    """
    from stragg.emucluster import ProcSpec

    cluster, tag = hosts.cluster, f"{mode}-{transport}-{world}"
    outs = [os.path.join(hosts.workdir, f"{tag}-rank{r}.json") for r in range(world)]
    ranks = list(range(world)) if ranks is None else ranks
    specs = []
    for r in ranks:
        host = cluster.host(r % 2)
        extra = {"OMP_NUM_THREADS": "1", "STRAGG_TEST_WORKDIR": hosts.workdir}
        if advertise:
            extra["STRAGG_TCP_HOST"] = host.addr  # the address stragg's TCP transport advertises
        extra.update(env or {})
        rank_env = cluster.env(host.rank, r, world, r // 2, (world + 1) // 2, STORE_PORT, extra)
        rank_env.pop("STRAGG_TRANSPORT", None)
        if transport is not None:
            rank_env["STRAGG_TRANSPORT"] = transport
        if not advertise:
            rank_env.pop("STRAGG_TCP_HOST", None)
        argv = [sys.executable, RANK_SCRIPT, outs[r], mode]
        specs.append(ProcSpec(f"rank{r}", host.rank, argv, rank_env))
    return Started(cluster.launch(specs, output=None), ranks, outs)


def _collect(started: Started) -> tuple[list[dict], list[str]]:
    """Waits for the started ranks (RUN_TIMEOUT_S at most); their JSON results and outputs."""
    # fail_fast=False: in the fault modes ranks fail on purpose and every one must report.
    done = started.job.wait(timeout=RUN_TIMEOUT_S, fail_fast=False)
    results = []
    for r in started.ranks:
        try:
            with open(started.outs[r]) as f:
                results.append(json.load(f))
        except (OSError, ValueError):
            results.append({"rank": r, "ok": False, "error": "no result (died or hung)"})
    if done.timed_out:
        hung = [int(label[4:]) for label in done.killed if label.startswith("rank")]
        pytest.fail(
            f"ranks {hung} did not finish within {RUN_TIMEOUT_S} s\n"
            + _story(results, done.outputs)
        )
    return results, done.outputs


def _run(
    hosts: Any,
    world: int,
    mode: str,
    transport: str | None,
    advertise: bool = True,
    env: dict[str, str] | None = None,
) -> tuple[list[dict], list[str]]:
    """Runs `world` ranks across the two hosts; returns their JSON results and outputs."""
    return _collect(_start(hosts, world, mode, transport, advertise, env))


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


# ----------------------------------------------------------------------------------------------
# Faults on the TCP transport (the same cases as test_faults.py / test_allreduce_faults.py on
# one host, plus what only a network has: a cut link, strangers on the port)
# ----------------------------------------------------------------------------------------------

INTRUDER_SCRIPT = os.path.join(HERE, "scripts", "netns_intruder.py")
PORT_BASE = 29700  # rank r listens on PORT_BASE + r (outside the ephemeral range)


def _report(fault: str, results: list[dict]) -> None:
    """STRAGG_FAULT_REPORT=<file>: one JSON line per rank's error (see test_faults.py)."""
    path = os.environ.get("STRAGG_FAULT_REPORT")
    if not path:
        return
    with open(path, "a", encoding="utf-8") as fh:
        for r in results:
            msg = r.get("error") or r.get("second")
            if msg and msg != "completed":
                secs = r.get("error_after_s", r.get("second_after_s"))
                line = {"fault": f"tcp: {fault}", "rank": r["rank"], "seconds": secs}
                fh.write(json.dumps({**line, "message": msg}) + "\n")


@pytest.mark.stragg_only
def test_tcp_stopped_rank_is_named_by_every_survivor(two_hosts: Any) -> None:
    results, logs = _run(
        two_hosts, 4, "stop", "tcp", env={"STRAGG_TEST_PG_TIMEOUT_S": "8"}
    )
    story = _story(results, logs)
    assert all(r["ok"] for r in results), story
    _report("rank SIGSTOPped", results)
    for r in results:
        err = r["error"]
        if r["rank"] == 1:  # continued after the others gave up
            assert "aborted" in err and "rank 1 " in err and "stopped responding" in err, story
            continue
        assert "rank 1 " in err and "stopped responding (no heartbeat for " in err, story
        assert r["error_after_s"] < 8 + 10, story


@pytest.mark.stragg_only
def test_tcp_mismatch_raises_on_every_rank(two_hosts: Any) -> None:
    results, logs = _run(two_hosts, 4, "mismatch", "tcp", env={"STRAGG_TEST_PG_TIMEOUT_S": "30"})
    story = _story(results, logs)
    assert all(r["ok"] for r in results), story
    _report("numel mismatch", results)
    for r in results:
        assert "numel 10 (rank 0) vs 11 (rank 1)" in r["error"], story
        assert r["error_after_s"] < 10, story


def _blackhole(cluster: Any, host: int, match: str, table: int) -> None:
    """Policy routing on `host`: the TCP packets that `match` selects (e.g. "dport 29700") go
    into a blackhole (table and rule priority `table`). The rule dies with the namespace."""
    for cmd in (
        f"ip route add blackhole default table {table}",
        f"ip rule add {match} lookup {table} prio {table}",
    ):
        cluster.exec(host, cmd.split(), check=True)


def _cut_link(hosts: Any, port: int) -> None:
    """Silently drops every packet of the connections to `port` on host A from host B (policy
    routing into a blackhole on both ends: a pulled cable for those connections only)."""
    for host, selector in ((1, "dport"), (0, "sport")):
        _blackhole(hosts.cluster, host, f"ipproto tcp {selector} {port}", 100)


@pytest.mark.stragg_only
def test_tcp_cut_link_is_named_by_every_rank(two_hosts: Any) -> None:
    """The link between rank 2 (host A) and rank 3 (host B) goes silent mid-job; every other
    connection stays up. Every rank names that link, not a rank."""
    env = {"STRAGG_TEST_PG_TIMEOUT_S": "10", "STRAGG_TEST_TCP_PORT_BASE": str(PORT_BASE)}
    started = _start(two_hosts, 4, "cut", "tcp", env=env)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    ready = [os.path.join(two_hosts.workdir, f"ready.{r}") for r in range(4)]
    while not all(os.path.exists(p) for p in ready) and time.monotonic() < deadline:
        if not started.job.running():
            break
        time.sleep(0.05)
    try:
        _cut_link(two_hosts, PORT_BASE + 2)  # rank 3 connects to rank 2's port, nobody else
    except (subprocess.CalledProcessError, OSError) as exc:
        _emu.cannot(f"policy routing (ip rule ipproto/dport) unavailable: {exc}")
    finally:
        open(os.path.join(two_hosts.workdir, "go"), "w").close()
    results, logs = _collect(started)
    story = _story(results, logs)
    assert all(r["ok"] for r in results), story
    _report("link between ranks 2 and 3 cut", results)
    for r in results:
        assert "the connection between ranks 2 and 3 is down" in r["error"], story
        assert r["error_after_s"] < 10 + 10, story


@pytest.mark.stragg_only
def test_tcp_absent_rank_is_named(two_hosts: Any) -> None:
    """Rank 3 never starts; rank 0 hosts the store (tcp:// init) and fails in torch's TCPStore
    ('3/4 clients joined'); ranks 1 and 2 name rank 3, and only rank 3: rank 0 is missing from
    their setup too, but only because it waits for rank 3 in the TCPStore (or, when rank 0's wait
    ends first and takes the store with it, they point at rank 0's error)."""
    started = _start(two_hosts, 4, "check", "tcp", env={"STRAGG_TEST_PG_TIMEOUT_S": "5"},
                     ranks=[0, 1, 2])
    results, logs = _collect(started)
    story = _story(results, logs)
    assert not any(r["ok"] for r in results), story
    assert "clients joined" in results[0]["error"], story
    for r in results[1:]:
        err = r["error"]
        named = (
            "process group setup timed out after 5 s: rank 3 did not join (" in err
            and "the process that never started is rank 3" in err
            and "ranks [" not in err
        )
        store_gone = "lost the TCPStore" in err and "see rank 0's error" in err
        assert named or store_gone, story


@pytest.mark.stragg_only
def test_tcp_strays_during_setup_are_dropped(two_hosts: Any) -> None:
    """While rank 0 sets up its mesh (rank 1 held back by a rule that blackholes rank 0's replies
    to it), a stranger connects to its port with garbage, with a hello of another protocol
    version claiming to be rank 1, and with nothing at all: rank 0 drops the first two while it
    waits, then sets up with the real rank 1, drops the third, computes correctly and keeps the
    port open for re-dials of reset connections (tests/scripts/netns_intruder.py)."""
    env = {"STRAGG_TEST_PG_TIMEOUT_S": "60", "STRAGG_TEST_TCP_PORT_BASE": str(PORT_BASE)}
    from stragg.emucluster import ProcSpec

    cluster = two_hosts.cluster
    a, b = cluster.host(0), cluster.host(1)
    prio = 101
    try:
        _blackhole(cluster, 0, f"to {b.addr} ipproto tcp sport {PORT_BASE}", prio)
    except (subprocess.CalledProcessError, OSError) as exc:
        _emu.cannot(f"policy routing (ip rule ipproto/sport) unavailable: {exc}")
    out = os.path.join(two_hosts.workdir, "intruder.json")
    argv = [sys.executable, INTRUDER_SCRIPT, a.addr, str(PORT_BASE), str(prio), out]
    intruder = cluster.launch([ProcSpec("intruder", 0, argv, cluster.env(0))], output=None)
    results, logs = _collect(_start(two_hosts, 2, "check", "tcp", env=env))
    done = intruder.wait(timeout=120)
    intruder_out = done.outputs[0]
    _check_results(results, logs)
    if done.timed_out:
        pytest.fail(f"the intruder did not finish:\n{intruder_out}")
    assert os.path.exists(out), f"the intruder failed:\n{intruder_out}"
    with open(out) as f:
        seen = json.load(f)
    assert seen == {
        "garbage_dropped": True,
        "wrong_version_dropped": True,
        "idle_open_during_setup": True,
        "idle_dropped_after_setup": True,
        "port_open_after_setup": True,  # kept for re-dials (csrc/transport/tcp/resume.h)
    }, f"{seen}\n{intruder_out}"
