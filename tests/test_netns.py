"""Ranks on two emulated hosts: two network namespaces joined by a veth pair.

Every test makes its own namespaces ("stragg-<pid>-<n>-a/b"). The veth pair is created directly
inside them (`ip -n A link add ... peer ... netns B`), so no interface ever exists in the
caller's namespace; its two ends get 10.213.7.1/24 and 10.213.7.2/24, addresses that exist only
inside the two namespaces (nothing else is reachable from there: no default route). Optionally
a tbf rate limit is put on both ends. The namespaces, and with them the veth pair, are deleted by
the fixture's finalizer, also when a test fails; every rank process is killed and reaped.

Ranks alternate between the namespaces (rank r lives on host r % 2), so every ring hop crosses
the veth. Rank 0's namespace address hosts the TCPStore. Each rank runs
tests/scripts/netns_rank.py under `ip netns exec`.

Checks: ranks in different namespaces are not treated as one host (transport is not "shm";
with STRAGG_TRANSPORT=tcp it is "tcp"), all_reduce results match a reference and are bitwise
identical across ranks, and a rank killed on the other host is detected promptly.

Skips (with the reason) when not root, `ip` is missing, or namespaces cannot be created.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import _harness
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
RANK_SCRIPT = os.path.join(HERE, "scripts", "netns_rank.py")
SUBNET = "10.213.7"  # private test range; only ever assigned inside the test namespaces
STORE_PORT = 29517  # free: the namespaces are new
RUN_TIMEOUT_S = 300.0
_counter = itertools.count()

pytestmark = [pytest.mark.slow, pytest.mark.needs_backend]


@dataclasses.dataclass
class Host:
    netns: str
    ifname: str
    addr: str


@dataclasses.dataclass
class TwoHosts:
    hosts: tuple[Host, Host]
    workdir: str
    procs: list[subprocess.Popen] = dataclasses.field(default_factory=list)

    def host_of(self, rank: int) -> Host:
        return self.hosts[rank % 2]


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def _delete_netns(name: str) -> None:
    subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True, timeout=30)


def _kill_and_reap(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # each rank leads its own session
            except (ProcessLookupError, PermissionError):
                pass
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not fail
            pass


def _delete_stale_netns() -> None:
    """Deletes namespaces left by an earlier run of these tests that was killed (their names
    carry the pid of the pytest process that made them)."""
    listing = subprocess.run(
        ["ip", "netns", "list"], check=False, capture_output=True, text=True, timeout=30
    )
    for line in listing.stdout.splitlines():
        match = re.fullmatch(r"(stragg-(\d+)-\d+-[ab])(\s.*)?", line.strip())
        if match and not os.path.exists(f"/proc/{match.group(2)}"):
            _delete_netns(match.group(1))


def _make_hosts(tag: str, created: list[str]) -> tuple[Host, Host]:
    names = (f"stragg-{tag}-a", f"stragg-{tag}-b")
    ifnames = (f"sgv{tag[-8:]}a", f"sgv{tag[-8:]}b")  # interface names: at most 15 chars
    for name in names:
        _ip("netns", "add", name)
        created.append(name)
    # Both ends are born inside the namespaces: nothing appears in the caller's namespace.
    veth = f"link add {ifnames[0]} type veth peer name {ifnames[1]} netns {names[1]}"
    _ip("-n", names[0], *veth.split())
    hosts = []
    for i, (name, ifname) in enumerate(zip(names, ifnames)):
        addr = f"{SUBNET}.{i + 1}"
        _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", name, "addr", "add", f"{addr}/24", "dev", ifname)
        _ip("-n", name, "link", "set", ifname, "up")
        hosts.append(Host(name, ifname, addr))
    return hosts[0], hosts[1]


@pytest.fixture
def two_hosts() -> Iterator[TwoHosts]:
    if not sys.platform.startswith("linux"):
        pytest.skip("network namespaces need Linux")
    if os.geteuid() != 0:
        pytest.skip("creating network namespaces needs root")
    if shutil.which("ip") is None:
        pytest.skip("the `ip` command (iproute2) is not installed")
    _delete_stale_netns()
    tag = f"{os.getpid()}-{next(_counter)}"
    created: list[str] = []
    workdir = tempfile.mkdtemp(prefix="stragg-netns-")
    env = None
    try:
        try:
            hosts = _make_hosts(tag, created)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
            detail = getattr(exc, "stderr", "") or str(exc)
            pytest.skip(f"cannot create network namespaces / veth pair: {detail.strip()}")
        env = TwoHosts(hosts, workdir)
        yield env
    finally:
        if env is not None:
            _kill_and_reap(env.procs)
        for name in created:
            _delete_netns(name)
        shutil.rmtree(workdir, ignore_errors=True)


def _rate_limit(hosts: TwoHosts, rate: str) -> None:
    """tbf on both veth ends (netem is often not built)."""
    for h in hosts.hosts:
        try:
            tbf = f"qdisc add dev {h.ifname} root tbf rate {rate} burst 256kb latency 100ms"
            subprocess.run(
                ["ip", "netns", "exec", h.netns, "tc", *tbf.split()],
                check=True,
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
            detail = getattr(exc, "stderr", "") or str(exc)
            pytest.skip(f"traffic shaping (tc tbf) unavailable: {detail.strip()}")


def _run(
    hosts: TwoHosts, world: int, mode: str, transport: str | None, advertise: bool = True
) -> tuple[list[dict], list[str]]:
    """Runs `world` ranks across the two hosts; returns their JSON results and log paths.

    advertise=False leaves STRAGG_TCP_HOST unset: the backend must find the rank's address
    itself (the local address that routes to the store host).
    """
    store = hosts.host_of(0).addr
    outs = [
        os.path.join(hosts.workdir, f"{mode}-{transport}-{world}-rank{r}.json")
        for r in range(world)
    ]
    logs = [
        os.path.join(hosts.workdir, f"{mode}-{transport}-{world}-rank{r}.log") for r in range(world)
    ]
    procs = []
    for r in range(world):
        h = hosts.host_of(r)
        env = dict(os.environ)
        env.pop("STRAGG_TRANSPORT", None)
        if transport is not None:
            env["STRAGG_TRANSPORT"] = transport
        env.update(
            GLOO_SOCKET_IFNAME=h.ifname,  # gloo would pick the hostname's address otherwise
            MASTER_ADDR=store,
            MASTER_PORT=str(STORE_PORT),
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
        )
        env.pop("STRAGG_TCP_HOST", None)
        if advertise:
            env["STRAGG_TCP_HOST"] = h.addr  # the address stragg's TCP transport advertises
        args = [str(r), str(world), store, str(STORE_PORT), outs[r], mode]
        cmd = ["ip", "netns", "exec", h.netns, sys.executable, RANK_SCRIPT, *args]
        with open(logs[r], "w") as log:
            p = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        procs.append(p)
        hosts.procs.append(p)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            break
    hung = [r for r, p in enumerate(procs) if p.poll() is None]
    _kill_and_reap(procs)
    results = []
    for r in range(world):
        try:
            with open(outs[r]) as f:
                results.append(json.load(f))
        except (OSError, ValueError):
            results.append({"rank": r, "ok": False, "error": "no result (died or hung)"})
    if hung:
        pytest.fail(
            f"ranks {hung} did not finish within {RUN_TIMEOUT_S} s\n" + _story(results, logs)
        )
    return results, logs


def _story(results: list[dict], logs: list[str]) -> str:
    parts = []
    for res, log in zip(results, logs):
        parts.append(
            f"--- rank {res.get('rank')}: ok={res.get('ok')} stage={res.get('stage')} "
            f"error={res.get('error')}\n{res.get('traceback', '')}"
        )
        try:
            with open(log) as f:
                tail = f.read()[-3000:]
        except OSError:
            tail = ""
        if tail.strip():
            parts.append(f"    log tail:\n{tail}")
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
def test_ranks_in_two_namespaces_are_not_one_host(two_hosts: TwoHosts, world: int) -> None:
    """STRAGG_TRANSPORT unset (auto): never shared memory across hosts; results correct."""
    results, logs = _run(two_hosts, world, "check", transport=None)
    _check_results(results, logs)
    if _harness.is_stragg():
        transports = _transports(results)
        assert "shm" not in transports, transports
        assert len(set(transports)) == 1, transports
        assert transports[0] in ("gloo", "tcp"), transports


@pytest.mark.stragg_only
@pytest.mark.parametrize("world", [2, 4])
def test_tcp_transport_across_namespaces(two_hosts: TwoHosts, world: int) -> None:
    results, logs = _run(two_hosts, world, "check", transport="tcp")
    _check_results(results, logs)
    assert _transports(results) == ["tcp"] * world
    for res in results:
        ran = res["stats_after"]["allreduce_calls"] - res["stats_before"]["allreduce_calls"]
        assert ran == len(res["cases"]), f"rank {res['rank']}: not run on stragg's executor: {res}"


@pytest.mark.stragg_only
def test_tcp_transport_finds_its_address_without_stragg_tcp_host(two_hosts: TwoHosts) -> None:
    results, logs = _run(two_hosts, 2, "check", transport="tcp", advertise=False)
    _check_results(results, logs)
    assert _transports(results) == ["tcp", "tcp"]


@pytest.mark.stragg_only
def test_tcp_transport_over_a_rate_limited_link(two_hosts: TwoHosts) -> None:
    _rate_limit(two_hosts, "800mbit")
    results, logs = _run(two_hosts, 2, "check", transport="tcp")
    _check_results(results, logs)
    assert _transports(results) == ["tcp", "tcp"]


@pytest.mark.stragg_only
@pytest.mark.parametrize("transport", [None, "tcp"])
def test_rank_killed_on_the_other_host_is_detected(
    two_hosts: TwoHosts, transport: str | None
) -> None:
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
