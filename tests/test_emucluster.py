"""stragg.emucluster: an emulated multi-host cluster (network namespaces on a bridge, tc-shaped
links) with a per-host launcher.

Checks: up/down leave nothing behind and are idempotent; a second `up` removes what the first
left; the cluster and every job process are gone after an exception in the `with` block, a
failing job, a timeout, Ctrl-C and SIGTERM; jobs see RANK/WORLD_SIZE/MASTER_ADDR/... and their own host
address; cut/restore stops and resumes a TCP connection without breaking it; a degraded host's
link runs at R / l relative to a healthy one (a ratio band: a property of tc, not of our speed);
loss drops that share of packets; torchrun launches across hosts; without root every command
says so in one line; every user-facing argument error has a message.

Several NICs and the faults injected while a job runs (reachability probed with
tests/scripts/emu_probe.py: "refused" is a reply, "timeout" silence): every NIC on its own
switch, subnet and rate, nothing in the caller's namespace, the job's environment unchanged for
one NIC; a pulled NIC is silent while the host's other NIC works, a timed pull comes back by
itself and the connection over it resumes, teardown cancels a pending one; a connection reset
(ss -K) is seen by the peer as a reset, and where ss cannot kill (a stand-in ss that drops -K)
the error says so; a cut pair drops each other's packets while both reach a third host, also
unshaped and across a re-shape, and heals; the CLI verbs for each.

Every test makes its own cluster, named t<pid>x<n> (tests/_emu.py removes those of dead pytest
processes). Needs root: skips otherwise, and FAILS under STRAGG_TEST_REQUIRE=1.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import _emu
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ECHO = os.path.join(HERE, "scripts", "emu_echo.py")
CLI = [sys.executable, "-m", "stragg.emucluster"]

pytestmark = pytest.mark.needs_backend  # imports stragg (the package imports its extension)


@pytest.fixture(scope="module")
def emu() -> Any:
    """The stragg.emucluster module, once it has shown that it can make a cluster here."""
    return _emu.emucluster()


@pytest.fixture(scope="module")
def emu_module() -> Any:
    """The module alone (for checks that need no privileges)."""
    from stragg import emucluster

    return emucluster


@pytest.fixture
def cluster(emu: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    kw = {"hosts": 3, "rate": "200mbit"}
    kw.update(getattr(request, "param", {}))
    with emu.EmuCluster(name=_emu.new_name(), **kw) as c:
        yield c
    assert emu.net.own_namespaces(c.name) == []


def _cli(*args: str, timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args], check=False, capture_output=True, text=True, timeout=timeout, **kw
    )


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _root_ns_snapshot() -> tuple[str, str, str]:
    """The caller's interfaces, addresses and routes (must not change)."""
    out = [
        subprocess.run(["ip", *a], check=False, capture_output=True, text=True).stdout
        for a in (["-o", "link"], ["-o", "addr"], ["route"])
    ]
    links = re.sub(r"\s+(RX|TX):.*", "", out[0])  # counters change; names and flags do not
    return links, out[1], out[2]


# ---------------------------------------------------------------------------------------------
# Lifecycle


def test_up_status_down_leave_nothing_behind(emu: Any) -> None:
    before = _root_ns_snapshot()
    name = _emu.new_name()
    up = _cli(
        "up", "--hosts", "3", "--rate", "200mbit", "--degrade", "2=2", "--name", name, "--json"
    )
    assert up.returncode == 0, up.stderr
    status = json.loads(up.stdout)
    assert [h["addr"] for h in status["hosts"]] == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]
    assert [h["rate_bit"] for h in status["hosts"]] == [200_000_000, 200_000_000, 100_000_000]
    assert status["master_addr"] == "10.77.0.1"
    assert emu.net.own_namespaces(name) == [f"emu-{name}-h{i}" for i in range(3)] + [
        f"emu-{name}-sw"
    ]
    assert _root_ns_snapshot() == before  # addresses and links exist only inside the namespaces
    for h in status["hosts"]:
        addrs = subprocess.run(
            ["ip", "-n", h["netns"], "-o", "addr"], check=True, capture_output=True, text=True
        )
        assert f"inet {h['addr']}/24" in addrs.stdout
        assert re.search(r"\blo\s+inet 127\.0\.0\.1/8", addrs.stdout), addrs.stdout
    shown = _cli("status", "--name", name)
    assert shown.returncode == 0 and "100 Mbit/s  (degraded, l = 2)" in shown.stdout, shown.stdout
    down = _cli("down", "--name", name)
    assert down.returncode == 0 and "removed 4 namespaces" in down.stdout, down.stdout + down.stderr
    assert emu.net.own_namespaces(name) == []
    assert not os.path.exists(emu.net.state_path(name))
    assert not [d for d in os.listdir(emu.net.NETNS_ETC) if d.startswith(f"emu-{name}-")]
    again = _cli("down", "--name", name)
    assert again.returncode == 0 and "nothing to remove" in again.stdout
    assert _root_ns_snapshot() == before


def test_up_removes_the_leftovers_of_an_earlier_cluster(emu: Any) -> None:
    name = _emu.new_name()
    try:
        assert _cli("up", "--hosts", "4", "--name", name).returncode == 0
        os.unlink(emu.net.state_path(name))  # as if the first one was killed half-way
        second = _cli("up", "--hosts", "2", "--rate", "50mbit", "--name", name, "--json")
        assert second.returncode == 0, second.stderr
        assert emu.net.own_namespaces(name) == [
            f"emu-{name}-h0",
            f"emu-{name}-h1",
            f"emu-{name}-sw",
        ]
        assert [h["rate_bit"] for h in json.loads(second.stdout)["hosts"]] == [50_000_000] * 2
    finally:
        emu.net.remove(name)


def test_exception_in_with_block_kills_the_job_and_tears_down(emu: Any) -> None:
    name = _emu.new_name()
    with pytest.raises(RuntimeError, match="boom"), emu.EmuCluster(hosts=2, name=name) as c:
        pids = c.spawn(["sleep", "300"], output=None).pids
        raise RuntimeError("boom")
    assert not any(_alive(p) for p in pids)
    assert emu.net.own_namespaces(name) == []


_SIGTERM_PROGRAM = """
import signal, sys, time
from stragg import emucluster
name = sys.argv[1]
before = signal.getsignal(signal.SIGTERM)
with emucluster.EmuCluster(hosts=1, name=name + "a"):
    inside = signal.getsignal(signal.SIGTERM)
print("handlers", before == signal.SIG_DFL, inside != before,
      signal.getsignal(signal.SIGTERM) == before, flush=True)
with emucluster.EmuCluster(hosts=2, name=name) as c:
    print("pids", *c.spawn(["sleep", "300"], output=None).pids, flush=True)
    time.sleep(300)
"""


def test_sigterm_inside_the_with_block_tears_down(emu: Any) -> None:
    # A program using the API (benchmarks/degraded.py) killed with SIGTERM: its default action
    # would skip the with-block's teardown and leave the namespaces behind.
    name = _emu.new_name()
    proc = subprocess.Popen(
        [sys.executable, "-c", _SIGTERM_PROGRAM, name],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        handlers = proc.stdout.readline().split()
        # Replaced inside a with-block only where it was the default, restored after it.
        assert handlers == ["handlers", "True", "True", "True"], handlers
        line = proc.stdout.readline()
        assert line.startswith("pids"), proc.stderr.read() if proc.stderr else ""
        pids = [int(p) for p in line.split()[1:]]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err
    assert not any(_alive(p) for p in pids)
    assert emu.net.own_namespaces(name) == [] and emu.net.own_namespaces(name + "a") == []


def test_failing_job_kills_the_others_and_reports_its_status(emu: Any, cluster: Any) -> None:
    script = 'if [ "$RANK" = 1 ]; then echo failing; exit 3; fi; sleep 300'
    start = time.monotonic()
    result = cluster.run(["sh", "-c", script], fail_grace=0.5, output=None)
    assert time.monotonic() - start < 60  # not the 300 s of the sleepers
    assert result.first_failure == "h1" and result.worst == 3, result.describe()
    assert result.killed == ["h0", "h2"]
    assert result.output("h1") == "failing\n"
    with pytest.raises(emu.EmuClusterError, match=r"failed \(exit 3, first failure h1"):
        cluster.run(["sh", "-c", script], fail_grace=0.5, output=None, check=True)


def test_cli_run_failing_job_exit_status_and_teardown(emu: Any) -> None:
    name = _emu.new_name()
    script = 'echo "hello from $RANK"; [ "$RANK" = 0 ] && exit 5; sleep 300'
    done = _cli(
        "run", "--hosts", "2", "--name", name, "--fail-grace", "0.5", "--", "sh", "-c", script
    )
    assert done.returncode == 5, done.stdout + done.stderr
    assert "[h0] hello from 0" in done.stdout and "[h1] hello from 1" in done.stdout
    assert "h0 failed first" in done.stderr
    assert emu.net.own_namespaces(name) == []  # a cluster made by `run --hosts` goes with it


def test_cli_run_timeout(emu: Any) -> None:
    name = _emu.new_name()
    done = _cli("run", "--hosts", "2", "--name", name, "--timeout", "1", "--", "sleep", "300")
    assert done.returncode == 124, done.stderr
    assert "timed out after 1 s; killed ['h0', 'h1']" in done.stderr
    assert emu.net.own_namespaces(name) == []


def test_cli_run_ctrl_c_kills_every_process_and_tears_down(emu: Any) -> None:
    name = _emu.new_name()
    script = 'echo "pid $$"; sh -c "sleep 300" & wait'  # a grandchild too
    proc = subprocess.Popen(
        [*CLI, "run", "--hosts", "2", "--name", name, "--", "sh", "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A launcher that does not stop dumps every thread's stack on the SIGABRT below.
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
        # Ctrl-C as in a terminal: a test run started in the background of a shell without job
        # control (nohup CMD &) inherits SIGINT ignored, and Python then never raises
        # KeyboardInterrupt (seen in CI: the launcher sat in Job.wait).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        pids = []
        assert proc.stdout is not None
        while len(pids) < 2:
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            pids.append(int(line.split()[-1]))
        in_ns = [p for i in range(2) for p in emu.net.netns_pids(emu.net.host_ns(name, i))]
        assert len(in_ns) >= 4, in_ns  # the two shells and their sleeps
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=30)
            raise AssertionError(f"the launcher ignored SIGINT for 60 s; its stacks:\n{err}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "interrupted (SIGINT)" in err, err
    assert not any(_alive(p) for p in in_ns)
    assert emu.net.own_namespaces(name) == []


# ---------------------------------------------------------------------------------------------
# What a job sees

_SHOW_ENV = """
import json, os, socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect((os.environ["MASTER_ADDR"], 9))
keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
        "MASTER_PORT", "GLOO_SOCKET_IFNAME", "EMU_HOST", "EMU_NICS"]
print(json.dumps({**{k: os.environ.get(k) for k in keys}, "addr": s.getsockname()[0]}))
"""


def test_job_environment(cluster: Any) -> None:
    result = cluster.run([sys.executable, "-c", _SHOW_ENV], nproc_per_node=2, output=None)
    assert result.ok, result.describe()
    assert result.labels == ["h0.0", "h0.1", "h1.0", "h1.1", "h2.0", "h2.1"]
    seen = [json.loads(out) for out in result.outputs]
    for i, env in enumerate(seen):
        host, local = divmod(i, 2)
        assert env == {
            "RANK": str(i),
            "WORLD_SIZE": "6",
            "LOCAL_RANK": str(local),
            "LOCAL_WORLD_SIZE": "2",
            "NODE_RANK": str(host),
            "MASTER_ADDR": "10.77.0.1",
            "MASTER_PORT": "29500",
            "GLOO_SOCKET_IFNAME": "eth0",
            "EMU_HOST": str(host),
            "EMU_NICS": None,  # one NIC: the environment is what it always was
            "addr": f"10.77.0.{host + 1}",
        }


def test_hosts_run_reno_without_slow_start_after_idle_unless_told_otherwise(emu: Any, cluster: Any) -> None:
    for h in range(3):
        done = cluster.exec(h, ["cat", "/proc/sys/net/ipv4/tcp_congestion_control"])
        assert done.stdout.strip() == "reno", done
    assert {h["congestion"] for h in cluster.status()["hosts"]} == {"reno"}
    for h in range(3):  # tuned as training clusters are, unless told otherwise
        done = cluster.exec(h, ["cat", "/proc/sys/net/ipv4/tcp_slow_start_after_idle"])
        assert done.stdout.strip() == "0", done
    assert not any(h["slow_start_after_idle"] for h in cluster.status()["hosts"])
    with emu.EmuCluster(hosts=1, rate=None, name=_emu.new_name(), slow_start_after_idle=True) as c:
        assert c.exec(0, ["cat", "/proc/sys/net/ipv4/tcp_slow_start_after_idle"]).stdout.strip() == "1"
    with pytest.raises(emu.EmuClusterError, match="cannot set TCP congestion control 'nosuchcc'"):
        with emu.EmuCluster(hosts=1, rate="100mbit", name=_emu.new_name(), congestion="nosuchcc"):
            pass


def test_hosts_resolve_each_other_by_name(cluster: Any) -> None:
    done = cluster.exec(1, ["getent", "hosts", "h2"])
    assert done.returncode == 0 and done.stdout.split()[0] == "10.77.0.3", done


@pytest.mark.slow
def test_torchrun_launch_across_hosts(cluster: Any, tmp_path: Any) -> None:
    script = tmp_path / "job.py"
    script.write_text(
        "import os, sys, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.tensor([float(dist.get_rank())]); dist.all_reduce(t)\n"
        "r = (dist.get_rank(), dist.get_world_size(), os.environ['EMU_HOST'], t.item())\n"
        "# One write per line: torchrun's workers share one pipe (PYTHONUNBUFFERED is set, so\n"
        "# print() would write each word separately and lines of two workers could interleave).\n"
        "sys.stdout.write('RESULT %d %d %s %s\\n' % r)\n"
        "dist.destroy_process_group()\n"
    )
    result = cluster.run([str(script)], torchrun=True, nproc_per_node=2, timeout=240, output=None)
    assert result.ok, result.describe()
    lines = [ln.split() for out in result.outputs for ln in out.splitlines() if "RESULT" in ln]
    assert sorted(int(w[1]) for w in lines) == list(range(6)), lines
    assert {(w[2], w[4]) for w in lines} == {("6", "15.0")}, lines  # world 6, 0 + 1 + ... + 5
    assert sorted(w[3] for w in lines) == ["0", "0", "1", "1", "2", "2"], lines  # 2 per host


# ---------------------------------------------------------------------------------------------
# The network


def _readline(proc: subprocess.Popen, timeout: float) -> str | None:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline().strip() if ready else None


def test_cut_silences_a_link_and_restore_resumes_the_same_connection(cluster: Any) -> None:
    server = subprocess.Popen(
        cluster.command(0, [sys.executable, ECHO, "server", "7000"]),
        stdout=subprocess.PIPE,
        text=True,
    )
    client = None
    try:
        assert _readline(server, 30) == "listening"
        client = subprocess.Popen(
            cluster.command(1, [sys.executable, ECHO, "client", "10.77.0.1", "7000"]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        assert _readline(client, 30) == "connected"
        client.stdin.write("a\n")
        assert _readline(client, 30) == "echo a"
        cluster.cut(1)
        assert cluster.is_cut(1) and not cluster.is_cut(0)
        client.stdin.write("b\n")
        assert _readline(client, 2.0) is None  # silence: no echo, no error
        reach = cluster.exec(
            2,
            [
                sys.executable,
                "-c",
                "import socket; socket.create_connection(('10.77.0.2', 7000), timeout=1)",
            ],
        )
        assert "timed out" in reach.stderr, reach.stderr  # not refused: nothing answers
        cluster.restore(1)
        assert not cluster.is_cut(1)
        assert _readline(client, 30) == "echo b"  # the same connection carried on
        client.stdin.write("c\n")
        assert _readline(client, 30) == "echo c"
    finally:
        for p in (client, server):
            if p is not None:
                p.kill()
                p.wait()


@pytest.mark.parametrize("cluster", [{"rate": "200mbit", "degrade": {2: 2.0}}], indirect=True)
def test_degraded_host_runs_at_rate_over_l(cluster: Any) -> None:
    healthy = cluster.throughput(0, 1, seconds=1.5)
    upload = cluster.throughput(2, 0, seconds=1.5)  # out of the degraded host
    download = cluster.throughput(1, 2, seconds=1.5)  # into it
    assert 0.5 * 200e6 < healthy <= 1.02 * 200e6, healthy  # goodput: below the shaped rate
    for degraded in (upload, download):
        assert 0.5 * 0.7 <= degraded / healthy <= 0.5 * 1.3, (healthy, upload, download)
    cluster.degrade(2, 4.0)  # re-shaped in place
    assert cluster.rate_of(2) == 50_000_000
    assert 0.25 * 0.7 <= cluster.throughput(2, 1, seconds=1.5) / healthy <= 0.25 * 1.3
    cluster.degrade(2, 1.0)
    assert 0.7 <= cluster.throughput(2, 1, seconds=1.5) / healthy <= 1.3


def test_cli_perf_and_degrade_on_a_running_cluster(cluster: Any) -> None:
    done = _cli("degrade", "1=4", "--name", cluster.name)
    assert done.returncode == 0 and "50 Mbit/s  (degraded, l = 4)" in done.stdout, done.stderr
    done = _cli("perf", "0", "1", "--seconds", "1", "--name", cluster.name)
    assert done.returncode == 0, done.stderr
    m = re.fullmatch(
        r"h0 -> h1: ([\d.]+) Mbit/s \(link rates 200 Mbit/s / 50 Mbit/s\)\n", done.stdout
    )
    assert m and 0.5 * 50 < float(m.group(1)) <= 50, done.stdout
    done = _cli("perf", "0", "9", "--name", cluster.name)
    assert (
        done.returncode == 1 and done.stderr == "emucluster: host 9 does not exist (hosts 0..2)\n"
    )


@pytest.mark.parametrize("cluster", [{"hosts": 2, "rate": "200mbit", "loss": "5%"}], indirect=True)
def test_loss_drops_that_share_of_packets(cluster: Any) -> None:
    assert cluster.throughput(0, 1, seconds=1.5) > 0
    sent, dropped = _emu.tc_packets(cluster, 0)
    assert sent > 1000, sent
    assert 0.03 <= dropped / (sent + dropped) <= 0.07, (sent, dropped)


def test_delay_is_applied_or_refused_clearly(emu: Any) -> None:
    name = _emu.new_name()
    try:
        with emu.EmuCluster(hosts=2, rate="200mbit", delay="20ms", name=name) as c:
            rtt = c.exec(
                0,
                [
                    sys.executable,
                    "-c",
                    (
                        "import socket, time; t = time.monotonic()\n"
                        "try: socket.create_connection(('10.77.0.2', 9), timeout=5)\n"
                        "except OSError: pass\nprint(time.monotonic() - t)"
                    ),
                ],
            )
            assert float(rtt.stdout) >= 0.04, rtt  # SYN and RST each delayed 20 ms
    except emu.EmuClusterError as exc:
        assert "--delay needs the netem qdisc, which this kernel lacks" in str(exc)
    assert emu.net.own_namespaces(name) == []


# ---------------------------------------------------------------------------------------------
# Errors


_NO_NET_ADMIN = ["--bounding-set", "-net_admin"]
_NOBODY = ["--reuid", "65534", "--regid", "65534", "--clear-groups"]


@pytest.mark.parametrize(
    "drop, commands",
    [
        (_NO_NET_ADMIN, [["up", "--hosts", "2"], ["run", "--hosts", "2", "--", "true"]]),
        (_NOBODY, [["up", "--hosts", "2"], ["down"], ["status"]]),
    ],
    ids=["no-cap-net-admin", "unprivileged-user"],
)
def test_without_privileges_it_says_so_in_one_line(
    emu: Any, drop: list[str], commands: list[list[str]]
) -> None:
    if shutil.which("setpriv") is None:
        _emu.cannot("setpriv (util-linux) is needed to drop privileges")
    name = _emu.new_name()
    for args in commands:
        argv = ["setpriv", *drop, *CLI, *args, *(["--name", name] if args != ["status"] else [])]
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        done = subprocess.run(argv, check=False, capture_output=True, text=True, env=env)
        assert done.returncode == 1, (args, done.stderr)
        assert done.stderr.count("\n") == 1, done.stderr  # one line
        assert done.stderr.startswith("emucluster: needs root ("), done.stderr
        assert "CAP_NET_ADMIN" in done.stderr and "run it as root" in done.stderr
    assert emu.net.own_namespaces(name) == []


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"hosts": 0}, "hosts must be >= 1, not 0"),
        ({"hosts": 2, "rate": "fast"}, "bad rate 'fast': expected a number and a unit"),
        ({"hosts": 2, "rate": "10bit"}, "rate '10bit' is below 8kbit"),
        ({"hosts": 2, "degrade": {2: 2.0}}, "degraded host 2 does not exist (hosts 0..1)"),
        ({"hosts": 2, "degrade": {1: 0.5}}, "degrade factor of host 1 is 0.5: must be >= 1"),
        ({"hosts": 2, "degrade": ["1=2", "1=3"]}, "host 1 is degraded twice"),
        ({"hosts": 2, "degrade": ["one=2"]}, "bad --degrade 'one=2': expected RANK=L"),
        ({"hosts": 2, "loss": "0.1"}, "bad loss '0.1': expected a percentage such as 0.1%"),
        ({"hosts": 2, "loss": "100%"}, "bad loss"),
        ({"hosts": 2, "delay": "1 hour"}, "bad delay '1 hour': expected a time such as 1ms"),
        ({"hosts": 2, "rate": None, "loss": "1%"}, "--delay / --loss need a --rate"),
        ({"hosts": 2, "name": "a b"}, "bad cluster name 'a b'"),
        ({"hosts": 2, "nics": 0}, "nics must be 1..8, not 0"),
        ({"hosts": 2, "nics": 2, "rate": ["100mbit"]}, "1 rates for 2 NICs: give one rate"),
        ({"hosts": 2, "nics": 2, "rate": "100mbit,fast"}, "bad rate 'fast'"),
    ],
)
def test_argument_errors(emu_module: Any, kw: dict, message: str) -> None:
    with pytest.raises(emu_module.EmuClusterError, match=re.escape(message)):
        emu_module.EmuCluster(**kw)


def test_subnet_and_missing_cluster_errors(emu: Any) -> None:
    with pytest.raises(
        emu.EmuClusterError, match=re.escape("4 hosts do not fit in subnet 10.77.0.0/30")
    ):
        emu.EmuCluster(hosts=4, name=_emu.new_name(), subnet="10.77.0.0/30").up()
    name = _emu.new_name()
    done = _cli("run", "--name", name, "--", "true")
    assert done.returncode == 1
    assert done.stderr == (
        f"emucluster: no emulated cluster {name!r} is up: start one with "
        f"`python -m stragg.emucluster up --hosts N --name {name}`\n"
    )
    assert _cli("cut", "0", "--name", name).stderr.startswith(
        f"emucluster: no emulated cluster {name!r}"
    )
    done = _cli("run", "--hosts", "2", "--name", name)
    assert done.returncode == 1 and "run: no command given" in done.stderr


# ---------------------------------------------------------------------------------------------
# Several NICs, and faults while a job runs

PROBE = os.path.join(HERE, "scripts", "emu_probe.py")


def _reach(cluster: Any, host: int, addrs: list[str], timeout: float = 1.0) -> dict[str, str]:
    """{addr: "refused" | "connected" | "timeout" | "error ..."} of TCP probes from `host`."""
    done = cluster.exec(host, [sys.executable, PROBE, *addrs, "--timeout", str(timeout)])
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _replies(outcomes: dict[str, str]) -> dict[str, bool]:
    """{addr: True when something answered} (refused or connected: the path works)."""
    return {a: o in ("refused", "connected") for a, o in outcomes.items()}


def _addrs(cluster: Any, host: int, nic: int | None = None) -> list[str]:
    return [a for k, (_, a) in enumerate(cluster.nics(host)) if nic is None or k == nic]


def _tc_rates(netns: str, dev: str) -> list[int]:
    """The rates (bit/s) of the htb classes on `dev` in `netns`."""
    from stragg.emucluster import net

    out = subprocess.run(["tc", "-n", netns, "class", "show", "dev", dev],
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    found = re.findall(r"^class htb \S+ .*? rate (\S+)", out, re.MULTILINE)
    return [net.parse_rate(r) for r in found]


class _Echo:
    """emu_echo.py's server on host `server` and one client connection to it from `client`."""

    def __init__(self, cluster: Any, server: int, client: int, addr: str, port: int) -> None:
        self.server = subprocess.Popen(
            cluster.command(server, [sys.executable, ECHO, "server", str(port)]),
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.client: subprocess.Popen | None = None
        assert _readline(self.server, 30) == "listening"
        self.client = subprocess.Popen(
            cluster.command(client, [sys.executable, ECHO, "client", addr, str(port)]),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
        )  # fmt: skip
        assert _readline(self.client, 30) == "connected"

    def send(self, line: str) -> None:
        assert self.client is not None and self.client.stdin is not None
        self.client.stdin.write(line + "\n")

    def close(self) -> None:
        for p in (self.client, self.server):
            if p is not None:
                p.kill()
                p.wait()


@pytest.mark.parametrize(
    "cluster", [{"hosts": 3, "nics": 2, "rate": ["200mbit", "50mbit"]}], indirect=True
)
def test_hosts_with_several_nics_each_on_its_own_switch_subnet_and_rate(
    emu: Any, cluster: Any
) -> None:
    assert cluster.nics(0) == [("eth0", "10.77.0.1"), ("eth1", "10.77.1.1")]
    assert cluster.nics(2) == [("eth0", "10.77.0.3"), ("eth1", "10.77.1.3")]
    assert cluster.master_addr == "10.77.0.1"
    sw = emu.net.switch_ns(cluster.name)
    for h in range(3):
        host = cluster.host(h)
        addrs = subprocess.run(["ip", "-n", host.netns, "-o", "-4", "addr"], check=True,
                               capture_output=True, text=True).stdout  # fmt: skip
        assert f"eth0    inet 10.77.0.{h + 1}/24" in addrs, addrs
        assert f"eth1    inet 10.77.1.{h + 1}/24" in addrs, addrs
        # Each NIC shaped on its own, both ways: host side (upload) and switch side (download).
        assert _tc_rates(host.netns, "eth0") == [200_000_000]
        assert _tc_rates(host.netns, "eth1") == [50_000_000]
        assert _tc_rates(sw, f"h{h}") == [200_000_000]
        assert _tc_rates(sw, f"h{h}n1") == [50_000_000]
        assert [n.bridge for n in host.nics] == ["br0", "br1"]
    # Every NIC reaches the same NIC of the others (its own switch), never the other subnet.
    seen = _reach(cluster, 1, ["10.77.0.1", "10.77.1.1", "10.77.0.3", "10.77.1.3", "10.77.2.1"])
    assert seen == {"10.77.0.1": "refused", "10.77.1.1": "refused", "10.77.0.3": "refused",
                    "10.77.1.3": "refused", "10.77.2.1": "error ENETUNREACH"}, seen  # fmt: skip
    assert [cluster.rate_of(0, k) for k in (0, 1)] == [200_000_000, 50_000_000]
    cluster.degrade(1, 2.0)  # a degraded host: every NIC at its rate / l
    assert _tc_rates(cluster.host(1).netns, "eth1") == [25_000_000]
    assert _tc_rates(sw, "h1n1") == [25_000_000]
    goodput = cluster.throughput(2, 0, seconds=1.0, nic=1)  # over NIC 1: its own rate
    assert 0.5 * 50e6 < goodput <= 1.02 * 50e6, goodput
    status = cluster.status()
    assert status["nics"] == 2 and status["nic_rates_bit"] == [200_000_000, 50_000_000]
    assert [n["rate_bit"] for n in status["hosts"][1]["nics"]] == [100_000_000, 25_000_000]
    shown = _cli("status", "--name", cluster.name)
    assert "3 hosts of 2 NICs on bridges br0..br1" in shown.stdout, shown.stdout
    assert re.search(r"10\.77\.1\.2 +up +25 Mbit/s  \(degraded, l = 2\)  \(eth1\)",
                     shown.stdout), shown.stdout  # fmt: skip
    # The job's environment: names and MASTER_ADDR on NIC 0, every NIC listed.
    result = cluster.run([sys.executable, "-c", _SHOW_ENV], output=None)
    assert result.ok, result.describe()
    envs = [json.loads(out) for out in result.outputs]
    assert [e["EMU_NICS"] for e in envs] == [
        f"eth0=10.77.0.{h + 1},eth1=10.77.1.{h + 1}" for h in range(3)
    ]
    assert {(e["GLOO_SOCKET_IFNAME"], e["MASTER_ADDR"]) for e in envs} == {("eth0", "10.77.0.1")}
    assert [e["addr"] for e in envs] == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]


def test_several_nics_leave_nothing_in_the_callers_namespace(emu: Any) -> None:
    before = _root_ns_snapshot()
    name = _emu.new_name()
    up = _cli("up", "--hosts", "2", "--nics", "3", "--rate", "100mbit", "--name", name, "--json")
    assert up.returncode == 0, up.stderr
    assert [n["addr"] for n in json.loads(up.stdout)["hosts"][1]["nics"]] == [
        "10.77.0.2", "10.77.1.2", "10.77.2.2"
    ]  # fmt: skip
    assert _root_ns_snapshot() == before
    down = _cli("down", "--name", name)
    assert down.returncode == 0 and "removed 3 namespaces" in down.stdout, down.stdout
    assert emu.net.own_namespaces(name) == [] and _root_ns_snapshot() == before


@pytest.mark.parametrize("cluster", [{"hosts": 3, "nics": 2}], indirect=True)
def test_a_pulled_nic_is_silent_while_the_other_nic_works(emu: Any, cluster: Any) -> None:
    cluster.pull(1, 1)
    assert cluster.is_pulled(1, 1) and not cluster.is_pulled(1, 0) and not cluster.is_cut(1)
    seen = _replies(_reach(cluster, 0, _addrs(cluster, 1)))
    assert seen == {"10.77.0.2": True, "10.77.1.2": False}, seen
    seen = _replies(_reach(cluster, 2, _addrs(cluster, 0)))
    assert seen == {"10.77.0.1": True, "10.77.1.1": True}, seen
    assert [n["link"] for n in cluster.status()["hosts"][1]["nics"]] == ["up", "pulled"]
    cluster.plug(1, 1)
    assert not cluster.is_pulled(1, 1)
    assert all(_replies(_reach(cluster, 0, _addrs(cluster, 1))).values())
    cluster.cut(2)  # every NIC of the host
    assert cluster.is_cut(2) and cluster.is_pulled(2, 0) and cluster.is_pulled(2, 1)
    assert not any(_replies(_reach(cluster, 0, _addrs(cluster, 2))).values())
    cluster.restore(2)
    assert all(_replies(_reach(cluster, 0, _addrs(cluster, 2))).values())
    with pytest.raises(emu.EmuClusterError, match=re.escape("host 1 has no NIC 2 (NICs 0..1)")):
        cluster.pull(1, 2)


@pytest.mark.parametrize("cluster", [{"hosts": 2, "nics": 2}], indirect=True)
def test_a_timed_pull_comes_back_and_the_connection_over_it_resumes(cluster: Any) -> None:
    echo = _Echo(cluster, 0, 1, "10.77.1.1", 7001)  # over NIC 1
    try:
        echo.send("a")
        assert _readline(echo.client, 30) == "echo a"
        cluster.pull(1, 1, seconds=5)
        assert cluster.is_pulled(1, 1) and cluster.pending_plugs() == [(1, 1)]
        echo.send("b")  # sent into the pulled cable: retransmitted until it is back
        assert _readline(echo.client, 60) == "echo b"  # the same connection, no error
        deadline = time.monotonic() + 60
        while cluster.is_pulled(1, 1) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not cluster.is_pulled(1, 1) and cluster.pending_plugs() == []
        echo.send("c")
        assert _readline(echo.client, 30) == "echo c"
    finally:
        echo.close()


def test_teardown_cancels_a_pending_timed_pull(emu: Any) -> None:
    name = _emu.new_name()
    with emu.EmuCluster(hosts=2, nics=2, rate="100mbit", name=name) as c:
        c.pull(0, 1, seconds=600)
        c.pull(1, 0, seconds=600)
        assert c.pending_plugs() == [(0, 1), (1, 0)]
    assert c.pending_plugs() == []
    assert not [t for t in threading.enumerate() if t.name.startswith("emucluster-plug")]
    assert emu.net.own_namespaces(name) == []


def test_reset_connections_resets_every_tcp_connection_of_the_host(cluster: Any) -> None:
    echo = _Echo(cluster, 0, 1, "10.77.0.1", 7002)
    try:
        echo.send("a")
        assert _readline(echo.client, 30) == "echo a"
        killed = cluster.reset_connections(1)
        assert len(killed) == 1 and killed[0][1] == "10.77.0.1:7002", killed
        assert killed[0][0].startswith("10.77.0.2:"), killed
        line = _readline(echo.server, 30)  # the peer: a RST, not a clean close
        assert line is not None and line.startswith("error ConnectionResetError"), line
        echo.send("b")
        line = _readline(echo.client, 30)
        assert line is not None and line.startswith("error "), line  # ECONNABORTED locally
        assert cluster.reset_connections(1) == []  # nothing left: nothing to do, no error
        assert cluster.reset_connections(2) == []
    finally:
        echo.close()


def test_reset_connections_says_so_where_ss_cannot_kill(
    emu: Any, cluster: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An ss that lists but never destroys: what ss -K does on a kernel without
    # CONFIG_INET_DIAG_DESTROY (it skips the sockets it cannot destroy, silently).
    real = shutil.which("ss")
    assert real is not None
    fake = tmp_path / "ss"
    fake.write_text(f'#!/bin/sh\nfor a; do shift; [ "$a" = -K ] || set -- "$@" "$a"; done\n'
                    f'exec {real} "$@"\n')  # fmt: skip
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    echo = _Echo(cluster, 0, 1, "10.77.0.1", 7003)
    try:
        says = (r"cannot reset the TCP connections of host 1: `ss -K` destroyed 0 of 1 \(still "
                r"established: 10\.77\.0\.2:\d+ <-> 10\.77\.0\.1:7003\); this kernel cannot "
                r"destroy sockets \(it needs CONFIG_INET_DIAG_DESTROY\)")  # fmt: skip
        with pytest.raises(emu.EmuClusterError, match=says):
            cluster.reset_connections(1)
        echo.send("a")
        assert _readline(echo.client, 30) == "echo a"  # nothing was done to it
    finally:
        echo.close()


@pytest.mark.parametrize("cluster", [{"rate": "200mbit"}, {"rate": None}], indirect=True,
                         ids=["shaped", "unshaped"])  # fmt: skip
def test_a_cut_pair_drops_each_others_packets_while_both_reach_a_third_host(
    emu: Any, cluster: Any
) -> None:
    everyone = {h: _addrs(cluster, h) for h in range(3)}
    cluster.cut_pair(1, 0)
    assert cluster.cut_pairs == [(0, 1)]
    for h, expect in ((0, {1: False, 2: True}), (1, {0: False, 2: True}), (2, {0: True, 1: True})):
        others = [a for o in expect for a in everyone[o]]
        seen = _replies(_reach(cluster, h, others))
        assert seen == {everyone[o][0]: ok for o, ok in expect.items()}, (h, seen)
    assert emu.net.pair_drops(cluster.name, cluster.host(0)) > 0  # dropped at the switch, silently
    if cluster.rate_bit is not None:
        cluster.degrade(0, 2.0)  # re-shaping a port of the pair keeps the pair cut
        assert not _replies(_reach(cluster, 0, everyone[1]))["10.77.0.2"]
        assert _replies(_reach(cluster, 0, everyone[2]))["10.77.0.3"]
    cluster.heal_pair(0, 1)
    assert cluster.cut_pairs == []
    assert all(_replies(_reach(cluster, 0, everyone[1] + everyone[2])).values())
    assert all(_replies(_reach(cluster, 1, everyone[0])).values())
    with pytest.raises(emu.EmuClusterError, match="a pair needs two hosts, not host 2 twice"):
        cluster.cut_pair(2, 2)


@pytest.mark.parametrize("cluster", [{"hosts": 3, "nics": 2}], indirect=True)
def test_cli_fault_verbs(cluster: Any) -> None:
    name = cluster.name
    done = _cli("pull", "1", "1", "--name", name)
    assert done.returncode == 0 and "h1 eth1: cable pulled" in done.stdout, done.stderr
    assert cluster.is_pulled(1, 1)
    done = _cli("cut-pair", "0", "2", "--name", name)
    assert done.returncode == 0 and done.stdout == "h0 and h2 drop each other's packets\n"
    assert cluster.cut_pairs == [(0, 2)]  # the state file carries it to other processes
    assert not _replies(_reach(cluster, 2, ["10.77.0.1"]))["10.77.0.1"]
    shown = _cli("status", "--name", name).stdout
    assert re.search(r"10\.77\.1\.2 +pulled", shown), shown
    assert "cut pairs (drop each other's packets): 0-2" in shown, shown
    done = _cli("plug", "1", "1", "--name", name)
    assert done.returncode == 0 and not cluster.is_pulled(1, 1), done.stderr
    done = _cli("heal-pair", "2", "0", "--name", name)
    assert done.returncode == 0 and _replies(_reach(cluster, 2, ["10.77.0.1"]))["10.77.0.1"]
    done = _cli("pull", "2", "--seconds", "0.5", "--name", name)  # blocks, then plugs back
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "h2 eth0: cable pulled for 0.5 s", "h2 eth0: plugged back in"
    ]  # fmt: skip
    assert not cluster.is_pulled(2, 0)
    done = _cli("reset", "1", "--name", name)
    assert done.returncode == 0 and done.stdout == "h1: reset 0 TCP connections\n", done.stdout
