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


@dataclasses.dataclass
class Started:
    procs: dict[int, subprocess.Popen]
    outs: list[str]
    logs: list[str]


def _start(
    hosts: TwoHosts,
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
    store = hosts.host_of(0).addr
    tag = f"{mode}-{transport}-{world}"
    outs = [os.path.join(hosts.workdir, f"{tag}-rank{r}.json") for r in range(world)]
    logs = [os.path.join(hosts.workdir, f"{tag}-rank{r}.log") for r in range(world)]
    procs = {}
    for r in range(world) if ranks is None else ranks:
        h = hosts.host_of(r)
        rank_env = dict(os.environ)
        rank_env.pop("STRAGG_TRANSPORT", None)
        if transport is not None:
            rank_env["STRAGG_TRANSPORT"] = transport
        rank_env.update(
            GLOO_SOCKET_IFNAME=h.ifname,  # gloo would pick the hostname's address otherwise
            MASTER_ADDR=store,
            MASTER_PORT=str(STORE_PORT),
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
            STRAGG_TEST_WORKDIR=hosts.workdir,
        )
        rank_env.pop("STRAGG_TCP_HOST", None)
        if advertise:
            rank_env["STRAGG_TCP_HOST"] = h.addr  # the address stragg's TCP transport advertises
        rank_env.update(env or {})
        args = [str(r), str(world), store, str(STORE_PORT), outs[r], mode]
        cmd = ["ip", "netns", "exec", h.netns, sys.executable, RANK_SCRIPT, *args]
        with open(logs[r], "w") as log:
            p = subprocess.Popen(
                cmd, env=rank_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        procs[r] = p
        hosts.procs.append(p)
    return Started(procs, outs, logs)


def _collect(started: Started) -> tuple[list[dict], list[str]]:
    """Waits for the started ranks (RUN_TIMEOUT_S at most); their JSON results and log paths."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    for p in started.procs.values():
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            break
    hung = [r for r, p in started.procs.items() if p.poll() is None]
    _kill_and_reap(list(started.procs.values()))
    results = []
    for r in sorted(started.procs):
        try:
            with open(started.outs[r]) as f:
                results.append(json.load(f))
        except (OSError, ValueError):
            results.append({"rank": r, "ok": False, "error": "no result (died or hung)"})
    logs = [started.logs[r] for r in sorted(started.procs)]
    if hung:
        pytest.fail(
            f"ranks {hung} did not finish within {RUN_TIMEOUT_S} s\n" + _story(results, logs)
        )
    return results, logs


def _run(
    hosts: TwoHosts, world: int, mode: str, transport: str | None, advertise: bool = True,
    env: dict[str, str] | None = None,
) -> tuple[list[dict], list[str]]:
    """Runs `world` ranks across the two hosts; returns their JSON results and log paths."""
    return _collect(_start(hosts, world, mode, transport, advertise, env))


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
def test_tcp_stopped_rank_is_named_by_every_survivor(two_hosts: TwoHosts) -> None:
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
def test_tcp_mismatch_raises_on_every_rank(two_hosts: TwoHosts) -> None:
    results, logs = _run(two_hosts, 4, "mismatch", "tcp", env={"STRAGG_TEST_PG_TIMEOUT_S": "30"})
    story = _story(results, logs)
    assert all(r["ok"] for r in results), story
    _report("numel mismatch", results)
    for r in results:
        assert "numel 10 (rank 0) vs 11 (rank 1)" in r["error"], story
        assert r["error_after_s"] < 10, story


def _cut_link(hosts: TwoHosts, port: int) -> None:
    """Silently drops every packet of the connections to `port` on host A from host B (policy
    routing into a blackhole on both ends: a pulled cable for those connections only)."""
    a, b = hosts.hosts
    for host, selector in ((b, "dport"), (a, "sport")):
        _ip("-n", host.netns, "route", "add", "blackhole", "default", "table", "100")
        _ip("-n", host.netns, "rule", "add", "ipproto", "tcp", selector, str(port),
            "lookup", "100", "prio", "100")


@pytest.mark.stragg_only
def test_tcp_cut_link_is_named_by_every_rank(two_hosts: TwoHosts) -> None:
    """The link between rank 2 (host A) and rank 3 (host B) goes silent mid-job; every other
    connection stays up. Every rank names that link, not a rank."""
    env = {"STRAGG_TEST_PG_TIMEOUT_S": "10", "STRAGG_TEST_TCP_PORT_BASE": str(PORT_BASE)}
    started = _start(two_hosts, 4, "cut", "tcp", env=env)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    ready = [os.path.join(two_hosts.workdir, f"ready.{r}") for r in range(4)]
    while not all(os.path.exists(p) for p in ready) and time.monotonic() < deadline:
        if any(p.poll() is not None for p in started.procs.values()):
            break
        time.sleep(0.05)
    try:
        _cut_link(two_hosts, PORT_BASE + 2)  # rank 3 connects to rank 2's port, nobody else
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"policy routing (ip rule ipproto/dport) unavailable: {exc}")
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
def test_tcp_absent_rank_is_named(two_hosts: TwoHosts) -> None:
    """Rank 3 never starts; rank 0 hosts the store (tcp:// init) and fails in torch's TCPStore
    ('3/4 clients joined'); ranks 1 and 2 name rank 3."""
    started = _start(two_hosts, 4, "check", "tcp", env={"STRAGG_TEST_PG_TIMEOUT_S": "5"},
                     ranks=[0, 1, 2])
    results, logs = _collect(started)
    story = _story(results, logs)
    assert not any(r["ok"] for r in results), story
    assert "clients joined" in results[0]["error"], story
    for r in results[1:]:
        named = "the process that never started is rank 3" in r["error"]
        store_gone = "lost the TCPStore" in r["error"] and "see rank 0's error" in r["error"]
        assert named or store_gone, story


@pytest.mark.stragg_only
def test_tcp_strays_during_setup_are_dropped(two_hosts: TwoHosts) -> None:
    """While rank 0 sets up its mesh, a stranger connects to its port with garbage, with a hello
    of another protocol version claiming to be rank 1, and with nothing at all: rank 0 drops
    them, sets up with the real rank 1 and computes correctly; the port is closed afterwards."""
    env = {"STRAGG_TEST_PG_TIMEOUT_S": "60", "STRAGG_TEST_TCP_PORT_BASE": str(PORT_BASE)}
    a = two_hosts.hosts[0]
    out = os.path.join(two_hosts.workdir, "intruder.json")
    intruder = subprocess.Popen(
        ["ip", "netns", "exec", a.netns, sys.executable, INTRUDER_SCRIPT, a.addr, str(PORT_BASE),
         os.path.join(two_hosts.workdir, "pid.1"), out],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, text=True,
    )
    two_hosts.procs.append(intruder)
    results, logs = _collect(_start(two_hosts, 2, "check", "tcp", env=env))
    _check_results(results, logs)
    try:
        intruder_out, _ = intruder.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the intruder did not finish")
    assert os.path.exists(out), f"the intruder failed:\n{intruder_out}"
    with open(out) as f:
        seen = json.load(f)
    if not seen["connected"]:
        pytest.skip("rank 1 connected before the stranger could: the setup window was missed")
    assert seen == {
        "connected": True,
        "garbage_dropped": True,
        "wrong_version_dropped": True,
        "idle_dropped_after_setup": True,
        "port_open_after_setup": False,
    }, f"{seen}\n{intruder_out}"
