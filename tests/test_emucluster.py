"""stragg.emucluster: an emulated multi-host cluster (network namespaces on a bridge, tc-shaped
links) with a per-host launcher.

Checks: up/down leave nothing behind and are idempotent; a second `up` removes what the first
left; the cluster and every job process are gone after an exception in the `with` block, a
failing job, a timeout, Ctrl-C and SIGTERM; jobs see RANK/WORLD_SIZE/MASTER_ADDR/... and their own host
address; cut/restore stops and resumes a TCP connection without breaking it; a degraded host's
link runs at R / l relative to a healthy one (a ratio band: a property of tc, not of our speed);
loss drops that share of packets; torchrun launches across hosts; without root every command
says so in one line; every user-facing argument error has a message.

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
        "MASTER_PORT", "GLOO_SOCKET_IFNAME", "EMU_HOST"]
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
