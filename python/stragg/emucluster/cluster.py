"""EmuCluster: the hosts of one emulated cluster, their links (shape, degrade, cut, restore), the
faults injected while a job runs (a NIC's cable pulled, for good or for N seconds; a host's TCP
connections reset; a pair of hosts cut from each other) and the jobs started on them; a context
manager that always tears the cluster down (also on Ctrl-C, SIGTERM and SIGHUP, so that no
namespace outlives the program), cancelling the timers of timed pulls first.

`spawn` / `run` start CMD once per host (K times with nproc_per_node) inside the host's namespace
with RANK (host * K + local), WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR
(host 0's address), MASTER_PORT, GLOO_SOCKET_IFNAME=eth0 (NIC 0) and EMU_HOST set; with several
NICs also EMU_NICS ("eth0=10.77.0.2,eth1=10.77.1.2": every NIC of the host and its address).
With torchrun=True they start, per host, `python -m torch.distributed.run --nnodes N
--nproc-per-node K --rdzv-backend c10d --rdzv-endpoint HOST0_ADDR:PORT --local-addr HOST_ADDR
--max-restarts 0 CMD` (CMD is a script, `-m module` or `--no-python prog`) and torchrun assigns
the ranks. Every namespace shares the machine's hostname, hence two departures from a real
cluster: no --node-rank (c10d rendezvous ignores it anyway), and host 0's agent is told to host
the store (--rdzv-conf is_host=1; 0 elsewhere). Hosts resolve each other as h<i>.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import Self


from . import net
from . import perf as _perf
from .jobs import Job, JobResult, ProcSpec
from .net import EmuClusterError, Host, PrivilegeError

__all__ = [
    "EmuCluster",
    "EmuClusterError",
    "Host",
    "Job",
    "JobResult",
    "PrivilegeError",
    "ProcSpec",
    "Terminated",
]

DEFAULT_NAME = "cluster"
DEFAULT_PORT = 29500
log = logging.getLogger("stragg.emucluster")
_STDOUT = object()  # "stream to sys.stdout as it is when the job starts"
_TERMINATING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(SystemExit):
    """SIGTERM or SIGHUP arrived inside `with EmuCluster(...)`: raised so that the with-block
    unwinds and tears the cluster down, as Ctrl-C's KeyboardInterrupt does; uncaught, the
    program exits with the shell's status for that signal (128 + signum) and no traceback."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


def _raise_terminated(signum: int, _frame: object) -> None:
    raise Terminated(signum)


def _catch_termination() -> dict[int, Any]:
    """Turns SIGTERM / SIGHUP into Terminated where they would kill the process outright (their
    default action skips every finally-block, leaving the namespaces behind); returns the
    handlers replaced. Only the main thread can set handlers; one the program set stays."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    replaced = {}
    for sig in _TERMINATING_SIGNALS:
        if signal.getsignal(sig) == signal.SIG_DFL:
            replaced[sig] = signal.signal(sig, _raise_terminated)
    return replaced


class EmuCluster:
    """N emulated hosts; a context manager that brings the cluster up and always tears it down.

    nics: NICs per host, each on its own switch and subnet, each shaped to `rate` on its own
    (rate may also be a list with one rate per NIC); names and MASTER_ADDR are on NIC 0."""

    def __init__(
        self,
        hosts: int,
        rate: Any = "400mbit",
        degrade: Any = None,
        delay: str | float | None = None,
        loss: str | float | None = None,
        name: str = DEFAULT_NAME,
        subnet: str = net.DEFAULT_SUBNET,
        master_port: int = DEFAULT_PORT,
        congestion: str = net.DEFAULT_CONGESTION,
        slow_start_after_idle: bool = False,
        nics: int = 1,
    ) -> None:
        self.name = net.check_name(name)
        if int(hosts) < 1:
            raise EmuClusterError(f"hosts must be >= 1, not {hosts}")
        self.size = int(hosts)
        if not 1 <= int(nics) <= net.MAX_NICS:
            raise EmuClusterError(f"nics must be 1..{net.MAX_NICS}, not {nics}")
        self.nic_count = int(nics)
        self.nic_rates_bit = net.parse_rates(rate, self.nic_count)  # NIC k's R_k (None: unshaped)
        self.rate_bit = None if self.nic_rates_bit is None else self.nic_rates_bit[0]
        self.factors = net.parse_degrade(degrade or {}, self.size)
        self.loss = net.parse_loss(loss)
        self.delay_us = net.parse_delay(delay)
        if (self.loss or self.delay_us) and self.rate_bit is None:
            raise EmuClusterError("--delay / --loss need a --rate (they hang off its qdisc)")
        self.subnet = subnet
        self.master_port = int(master_port)
        self.congestion = str(congestion)  # every host's TCP congestion control ('system': as is)
        # The hosts' net.ipv4.tcp_slow_start_after_idle (off: as tuned training clusters run).
        self.slow_start_after_idle = bool(slow_start_after_idle)
        self._hosts: list[Host] = []
        self._jobs: list[Job] = []
        self._owner = True  # False when attached to a cluster made by an earlier `up`
        self._replaced_handlers: dict[int, Any] = {}  # signal handlers the with-block replaced
        self._cut_pairs: set[tuple[int, int]] = set()  # (a, b), a < b: drop each other's packets
        # Timed pulls: (host, nic) -> the timer that plugs it back; the lock orders a timer's
        # plug against plug(), pull() and teardown (which cancels them all first).
        self._plug_timers: dict[tuple[int, int], threading.Timer] = {}
        self._timer_lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------------

    @classmethod
    def attach(cls, name: str = DEFAULT_NAME) -> EmuCluster:
        """The cluster an earlier `up` made (this object's exit kills its jobs, not the cluster)."""
        net.check_privileges()
        state = net.read_state(net.check_name(name))
        if state is None or net.switch_ns(name) not in net.all_namespaces():
            raise EmuClusterError(
                f"no emulated cluster {name!r} is up: start one with "
                f"`python -m stragg.emucluster up --hosts N --name {name}`"
            )
        nics = int(state.get("nics", 1))
        c = cls(
            state["size"],
            state.get("nic_rates_bit") or state["rate_bit"],
            {int(k): v for k, v in state["factors"].items()},
            state["delay_us"] / 1e6,
            state["loss"],
            name,
            state["subnet"],
            state["master_port"],
            state.get("congestion", "system"),
            state.get("slow_start_after_idle", True),
            nics=nics,
        )
        c._hosts = [Host.from_dict(h) for h in state["hosts"]]
        c._cut_pairs = {(int(a), int(b)) for a, b in state.get("cut_pairs", [])}
        c._owner = False
        return c

    def up(self) -> EmuCluster:
        net.check_privileges()
        net.remove(self.name)  # leftovers of an earlier cluster of this name
        try:
            self._hosts = net.create(self.name, self.size, self.subnet, self.nic_count)
            net.set_congestion(self._hosts, self.congestion)
            net.set_slow_start_after_idle(self._hosts, self.slow_start_after_idle)
            for h in list(self._hosts):
                self._apply_shape(h.rank, self.factors.get(h.rank, 1.0))
            self._save()
        except BaseException:
            net.remove(self.name)
            self._hosts = []
            raise
        return self

    def down(self) -> list[str]:
        """Kills every job, deletes every namespace, link and qdisc of the cluster (idempotent);
        timed pulls still pending are cancelled first."""
        self._cancel_timers()
        self.kill_jobs()
        self._hosts = []
        self._cut_pairs = set()
        return net.remove(self.name)

    def kill_jobs(self) -> None:
        for job in list(self._jobs):
            job.kill()
        self._jobs.clear()

    def __enter__(self) -> Self:
        self._replaced_handlers = _catch_termination()
        try:
            if self._owner:
                self.up()
        except BaseException:
            self._restore_handlers()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self._owner:
                self.down()
            else:
                # An attached cluster stays up: a timed pull still pending ends now (plugged
                # back) rather than never, since no timer of this process will plug it later.
                for host, nic in self._cancel_timers():
                    net.set_link(self.name, self.host(host), up=True, nic=nic)
                self.kill_jobs()
        finally:
            self._restore_handlers()

    def _restore_handlers(self) -> None:
        for sig, handler in self._replaced_handlers.items():
            signal.signal(sig, handler)
        self._replaced_handlers = {}

    # -- hosts and links ------------------------------------------------------------------------

    @property
    def hosts(self) -> list[Host]:
        if not self._hosts:
            raise EmuClusterError(f"emulated cluster {self.name!r} is not up")
        return list(self._hosts)

    def host(self, rank: int) -> Host:
        hosts = self.hosts
        if not 0 <= rank < len(hosts):
            raise EmuClusterError(f"host {rank} does not exist (hosts 0..{len(hosts) - 1})")
        return hosts[rank]

    @property
    def master_addr(self) -> str:
        return self.host(0).addr

    def nics(self, rank: int) -> list[tuple[str, str]]:
        """Host `rank`'s NICs as (interface name inside the host, address), NIC 0 first."""
        return [(n.ifname, n.addr) for n in self.host(rank).nics]

    def rate_of(self, rank: int, nic: int = 0) -> int | None:
        """The rate in bit/s (each direction) of host `rank`'s NIC `nic`, None if unshaped."""
        self.host(rank).nic(nic)
        if self.nic_rates_bit is None:
            return None
        return int(self.nic_rates_bit[nic] / self.host(rank).factor)

    def degrade(self, rank: int, factor: float) -> None:
        """Re-shapes host `rank` to R / factor (1 = healthy), also while a job runs."""
        self.host(rank)
        if self.rate_bit is None:
            raise EmuClusterError("cannot degrade a host of an unshaped cluster (no --rate)")
        net.parse_degrade({rank: factor}, self.size)
        self._apply_shape(rank, float(factor))
        self._save()

    def _apply_shape(self, rank: int, factor: float) -> None:
        self._hosts[rank] = h = self._hosts[rank].with_factor(factor)
        if factor == 1.0:
            self.factors.pop(rank, None)
        else:
            self.factors[rank] = factor
        if self.nic_rates_bit is not None:
            for k, rate in enumerate(self.nic_rates_bit):
                net.shape(self.name, h, int(rate / factor), self.loss, self.delay_us, nic=k)
            self._sync_pairs()
            if any(rank in pair for pair in self._cut_pairs):
                self._apply_pair_filters(rank)  # re-shaping dropped them

    def cut(self, rank: int) -> None:
        """Takes every link of host `rank` down (its peers see silence, it sees no carrier)."""
        net.set_link(self.name, self.host(rank), up=False)

    def restore(self, rank: int) -> None:
        """Brings every link of host `rank` up (also NICs pulled one by one)."""
        self._cancel_timers(rank)
        net.set_link(self.name, self.host(rank), up=True)

    def is_cut(self, rank: int) -> bool:
        """True when every NIC of host `rank` is down (cut, or each one pulled)."""
        h = self.host(rank)
        return not any(net.link_is_up(self.name, h, k) for k in range(len(h.nics)))

    # -- faults while a job runs ----------------------------------------------------------------

    def pull(self, rank: int, nic: int = 0, seconds: float | None = None) -> None:
        """Pulls the cable of host `rank`'s NIC `nic`: its link goes down (the host sees no
        carrier, its peers silence on that NIC) for good, or for `seconds`, after which a
        background timer plugs it back (teardown cancels the timer). Pulling a NIC already out
        replaces its timer."""
        h = self.host(rank)
        h.nic(nic)
        if seconds is not None and not float(seconds) > 0:
            raise EmuClusterError(f"pull: seconds must be > 0, not {seconds}")
        with self._timer_lock:
            old = self._plug_timers.pop((rank, nic), None)
            if old is not None:
                old.cancel()
            net.set_link(self.name, h, up=False, nic=nic)
            if seconds is not None:
                timer = threading.Timer(float(seconds), self._timed_plug, args=(rank, nic))
                timer.name = f"emucluster-plug-h{rank}-nic{nic}"
                timer.daemon = True
                self._plug_timers[(rank, nic)] = timer
                timer.start()

    def plug(self, rank: int, nic: int = 0) -> None:
        """Plugs host `rank`'s NIC `nic` back in (cancels a timed pull's timer)."""
        h = self.host(rank)
        h.nic(nic)
        with self._timer_lock:
            old = self._plug_timers.pop((rank, nic), None)
            if old is not None:
                old.cancel()
            net.set_link(self.name, h, up=True, nic=nic)

    def is_pulled(self, rank: int, nic: int = 0) -> bool:
        return not net.link_is_up(self.name, self.host(rank), nic)

    def pending_plugs(self) -> list[tuple[int, int]]:
        """(host, nic) of the timed pulls whose timer has not plugged them back yet."""
        with self._timer_lock:
            return sorted(self._plug_timers)

    def _timed_plug(self, rank: int, nic: int) -> None:
        with self._timer_lock:
            timer = self._plug_timers.get((rank, nic))
            if timer is None or timer is not threading.current_thread():
                return  # cancelled (plug, a new pull, teardown) after it had fired
            del self._plug_timers[(rank, nic)]
            try:
                net.set_link(self.name, self.host(rank), up=True, nic=nic)
            except EmuClusterError as exc:
                log.warning("emucluster: plugging host %d's NIC %d back failed: %s", rank, nic, exc)

    def _cancel_timers(self, rank: int | None = None) -> list[tuple[int, int]]:
        """Cancels the pending timed pulls (of host `rank`, or all) and waits for a timer that is
        plugging right now; returns the (host, nic) whose timer was cancelled before it plugged."""
        with self._timer_lock:
            keys = [k for k in self._plug_timers if rank is None or k[0] == rank]
            timers = [self._plug_timers.pop(k) for k in keys]
            for t in timers:
                t.cancel()
        for t in timers:
            if t is not threading.current_thread():
                t.join()
        return sorted(keys)

    def reset_connections(self, rank: int) -> list[tuple[str, str]]:
        """Resets every established TCP connection of host `rank` (`ss -K` in its namespace: the
        local sockets fail with ECONNABORTED, their peers get a RST); returns them as (local,
        peer) 'addr:port'. Raises EmuClusterError when the kernel cannot destroy sockets."""
        return net.reset_connections(self.host(rank))

    @property
    def cut_pairs(self) -> list[tuple[int, int]]:
        """The pairs of hosts cut from each other (cut_pair), smaller rank first."""
        self._sync_pairs()
        return sorted(self._cut_pairs)

    def cut_pair(self, a: int, b: int) -> None:
        """Hosts a and b drop every packet between each other, on every NIC, for good (until
        heal_pair); both still reach every other host."""
        pair = self._pair(a, b)
        self._sync_pairs()
        self._cut_pairs.add(pair)
        self._save()
        for r in pair:
            self._apply_pair_filters(r)

    def heal_pair(self, a: int, b: int) -> None:
        pair = self._pair(a, b)
        self._sync_pairs()
        self._cut_pairs.discard(pair)
        self._save()
        for r in pair:
            self._apply_pair_filters(r)

    def _sync_pairs(self) -> None:
        """The cut pairs as the state file has them: another process (the CLI attached to this
        cluster) may have cut or healed one."""
        state = net.read_state(self.name) if self._hosts else None
        if state is not None and "cut_pairs" in state:
            self._cut_pairs = {(int(a), int(b)) for a, b in state["cut_pairs"]}

    def _pair(self, a: int, b: int) -> tuple[int, int]:
        self.host(a)
        self.host(b)
        if a == b:
            raise EmuClusterError(f"a pair needs two hosts, not host {a} twice")
        return (min(a, b), max(a, b))

    def _apply_pair_filters(self, rank: int) -> None:
        peers = [b if a == rank else a for a, b in self._cut_pairs if rank in (a, b)]
        blocked = [n.addr for p in sorted(peers) for n in self.host(p).nics]
        net.set_pair_filters(self.name, self.host(rank), blocked, self.nic_rates_bit is not None)

    def status(self) -> dict[str, Any]:
        self._sync_pairs()
        state = self._state()
        for h in state["hosts"]:
            host = self.host(h["rank"])
            h["congestion"] = net.congestion_of(host)
            h["slow_start_after_idle"] = net.slow_start_after_idle_of(host)
            h["rate_bit"] = self.rate_of(h["rank"])
            h["link"] = "cut" if self.is_cut(h["rank"]) else "up"
            for n in h["nics"]:
                n["rate_bit"] = self.rate_of(h["rank"], n["index"])
                n["link"] = "up" if net.link_is_up(self.name, host, n["index"]) else "pulled"
        return state

    def _state(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "size": self.size,
            "rate_bit": self.rate_bit,
            "nics": self.nic_count,
            "nic_rates_bit": self.nic_rates_bit,
            "cut_pairs": [list(p) for p in sorted(self._cut_pairs)],
            "factors": {str(k): v for k, v in self.factors.items()},
            "loss": self.loss,
            "delay_us": self.delay_us,
            "subnet": self.subnet,
            "master_port": self.master_port,
            "congestion": self.congestion,
            "slow_start_after_idle": self.slow_start_after_idle,
            "switch_netns": net.switch_ns(self.name),
            "master_addr": self.master_addr,
            "hosts": [h.to_dict() for h in self.hosts],
        }

    def _save(self) -> None:
        net.write_state(self.name, self._state())

    def throughput(self, src: int, dst: int, seconds: float = 2.0, nic: int = 0) -> float:
        """TCP goodput (bit/s) of one stream from host src to host dst over NIC `nic`,
        measured by dst."""
        addr = self.host(dst).nic(nic).addr
        tool = [sys.executable, _perf.__file__]  # run as a file: no torch import
        recv = subprocess.Popen(
            self.command(dst, [*tool, "recv"]),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            port = recv.stdout.readline().strip()  # type: ignore[union-attr]
            if not port.isdigit():
                raise EmuClusterError(
                    f"throughput receiver on host {dst} failed: {recv.stderr.read()}"
                )  # type: ignore[union-attr]
            args = [*tool, "send", addr, port, str(seconds)]
            sent = self.exec(src, args, timeout=seconds + 60)
            if sent.returncode != 0:
                raise EmuClusterError(
                    f"throughput sender on host {src} failed: {sent.stderr.strip()}"
                )
            out, err = recv.communicate(timeout=60)
        finally:
            if recv.poll() is None:
                recv.kill()
                recv.wait()
        try:
            return float(json.loads(out.strip().splitlines()[-1])["bits_per_s"])
        except (ValueError, IndexError, KeyError) as exc:
            raise EmuClusterError(f"throughput receiver on host {dst}: {out!r} {err!r}") from exc

    # -- processes ------------------------------------------------------------------------------

    def command(self, rank: int, argv: Sequence[str]) -> list[str]:
        """argv run inside host `rank`'s namespace."""
        return ["ip", "netns", "exec", self.host(rank).netns, *argv]

    def exec(
        self, rank: int, argv: Sequence[str], timeout: float = 60, check: bool = False, **kw: Any
    ) -> subprocess.CompletedProcess:
        """Runs argv inside host `rank`'s namespace to completion (subprocess.run, captured)."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(self.command(rank, argv), check=check, timeout=timeout, **kw)

    def env(
        self,
        host: int,
        rank: int | None = None,
        world_size: int | None = None,
        local_rank: int = 0,
        local_world_size: int = 1,
        master_port: int | None = None,
        extra: dict[str, str] | None = None,
    ) -> dict[str, str]:
        """The environment of a process on host `host` (rank=None: torchrun sets the ranks)."""
        env = dict(os.environ)
        env["GLOO_SOCKET_IFNAME"] = self.host(host).ifname  # NIC 0 (the only one by default)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.update(EMU_HOST=str(host), EMU_CLUSTER=self.name)
        if self.nic_count > 1:
            env["EMU_NICS"] = ",".join(f"{i}={a}" for i, a in self.nics(host))
        else:
            env.pop("EMU_NICS", None)
        if rank is not None:
            env.update(
                RANK=str(rank),
                WORLD_SIZE=str(world_size if world_size is not None else self.size),
                LOCAL_RANK=str(local_rank),
                LOCAL_WORLD_SIZE=str(local_world_size),
                NODE_RANK=str(host),
                GROUP_RANK=str(host),
                MASTER_ADDR=self.master_addr,
                MASTER_PORT=str(master_port or self.master_port),
            )
        env.update(extra or {})
        return env

    def launch(self, specs: Sequence[ProcSpec], output: Any = _STDOUT) -> Job:
        """Starts prepared processes (ProcSpec.argv runs inside host ProcSpec.host's namespace)."""
        specs = [ProcSpec(s.label, s.host, self.command(s.host, s.argv), s.env) for s in specs]
        job = Job(specs, sys.stdout if output is _STDOUT else output, on_exit=self._forget)
        self._jobs.append(job)
        return job

    def _forget(self, job: Job) -> None:
        if job in self._jobs:
            self._jobs.remove(job)

    def spawn(
        self,
        cmd: Sequence[str],
        nproc_per_node: int = 1,
        torchrun: bool = False,
        env: dict[str, str] | None = None,
        output: IO[str] | None = _STDOUT,  # type: ignore[assignment]
        master_port: int | None = None,
    ) -> Job:
        """Starts cmd on every host (nproc_per_node times, or once under torchrun)."""
        if not cmd:
            raise EmuClusterError("no command to run")
        k = int(nproc_per_node)
        if k < 1:
            raise EmuClusterError(f"--nproc-per-node must be >= 1, not {k}")
        port = master_port or self.master_port
        specs = []
        for h in self.hosts:
            if torchrun:
                argv = [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--nnodes",
                    str(self.size),
                    "--nproc-per-node",
                    str(k),
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    f"{self.master_addr}:{port}",
                    "--rdzv-id",
                    self.name,
                    "--rdzv-conf",
                    f"is_host={int(h.rank == 0)}",
                    "--local-addr",
                    h.addr,
                    "--max-restarts",
                    "0",
                    *cmd,
                ]
                specs.append(ProcSpec(f"h{h.rank}", h.rank, argv, self.env(h.rank, extra=env)))
                continue
            for local in range(k):
                label = f"h{h.rank}" if k == 1 else f"h{h.rank}.{local}"
                e = self.env(h.rank, h.rank * k + local, self.size * k, local, k, port, env)
                specs.append(ProcSpec(label, h.rank, list(cmd), e))
        return self.launch(specs, output)

    def run(
        self,
        cmd: Sequence[str],
        timeout: float | None = None,
        fail_fast: bool = True,
        fail_grace: float = 5.0,
        check: bool = False,
        **spawn_kw: Any,
    ) -> JobResult:
        """spawn + wait; check=True raises EmuClusterError (with every process's output tail)
        unless every process exited 0."""
        job = self.spawn(cmd, **spawn_kw)
        result = job.wait(timeout=timeout, fail_fast=fail_fast, fail_grace=fail_grace)
        if check and not result.ok:
            raise EmuClusterError(
                f"job {' '.join(cmd)!r} failed (exit {result.worst}, first failure "
                f"{result.first_failure}, timed out {result.timed_out}):\n{result.describe()}"
            )
        return result

