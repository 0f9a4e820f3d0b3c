"""EmuCluster: the hosts of one emulated cluster, their links (shape, degrade, cut, restore) and
the jobs started on them; a context manager that always tears the cluster down (also on Ctrl-C,
SIGTERM and SIGHUP, so that no namespace outlives the program).

`spawn` / `run` start CMD once per host (K times with nproc_per_node) inside the host's namespace
with RANK (host * K + local), WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR
(host 0's address), MASTER_PORT, GLOO_SOCKET_IFNAME=eth0 (the host's only NIC) and EMU_HOST set.
With torchrun=True they start, per host, `python -m torch.distributed.run --nnodes N
--nproc-per-node K --rdzv-backend c10d --rdzv-endpoint HOST0_ADDR:PORT --local-addr HOST_ADDR
--max-restarts 0 CMD` (CMD is a script, `-m module` or `--no-python prog`) and torchrun assigns
the ranks. Every namespace shares the machine's hostname, hence two departures from a real
cluster: no --node-rank (c10d rendezvous ignores it anyway), and host 0's agent is told to host
the store (--rdzv-conf is_host=1; 0 elsewhere). Hosts resolve each other as h<i>.
"""

from __future__ import annotations

import json
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
    """N emulated hosts; a context manager that brings the cluster up and always tears it down."""

    def __init__(
        self,
        hosts: int,
        rate: str | int | None = "400mbit",
        degrade: Any = None,
        delay: str | float | None = None,
        loss: str | float | None = None,
        name: str = DEFAULT_NAME,
        subnet: str = net.DEFAULT_SUBNET,
        master_port: int = DEFAULT_PORT,
        congestion: str = net.DEFAULT_CONGESTION,
        slow_start_after_idle: bool = False,
    ) -> None:
        self.name = net.check_name(name)
        if int(hosts) < 1:
            raise EmuClusterError(f"hosts must be >= 1, not {hosts}")
        self.size = int(hosts)
        self.rate_bit = None if rate in (None, "none") else net.parse_rate(rate)
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
        c = cls(
            state["size"],
            state["rate_bit"],
            {int(k): v for k, v in state["factors"].items()},
            state["delay_us"] / 1e6,
            state["loss"],
            name,
            state["subnet"],
            state["master_port"],
            state.get("congestion", "system"),
            state.get("slow_start_after_idle", True),
        )
        c._hosts = [Host(**h) for h in state["hosts"]]
        c._owner = False
        return c

    def up(self) -> EmuCluster:
        net.check_privileges()
        net.remove(self.name)  # leftovers of an earlier cluster of this name
        try:
            self._hosts = net.create(self.name, self.size, self.subnet)
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
        """Kills every job, deletes every namespace, link and qdisc of the cluster (idempotent)."""
        self.kill_jobs()
        self._hosts = []
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

    def rate_of(self, rank: int) -> int | None:
        """Host `rank`'s link rate in bit/s (each direction), None if unshaped."""
        if self.rate_bit is None:
            return None
        return int(self.rate_bit / self.host(rank).factor)

    def degrade(self, rank: int, factor: float) -> None:
        """Re-shapes host `rank` to R / factor (1 = healthy), also while a job runs."""
        self.host(rank)
        if self.rate_bit is None:
            raise EmuClusterError("cannot degrade a host of an unshaped cluster (no --rate)")
        net.parse_degrade({rank: factor}, self.size)
        self._apply_shape(rank, float(factor))
        self._save()

    def _apply_shape(self, rank: int, factor: float) -> None:
        h = self._hosts[rank]
        self._hosts[rank] = h = Host(h.rank, h.netns, h.ifname, h.port, h.addr, factor)
        if factor == 1.0:
            self.factors.pop(rank, None)
        else:
            self.factors[rank] = factor
        if self.rate_bit is not None:
            net.shape(self.name, h, int(self.rate_bit / factor), self.loss, self.delay_us)

    def cut(self, rank: int) -> None:
        """Takes host `rank`'s link down (its peers see silence, it sees no carrier)."""
        net.set_link(self.name, self.host(rank), up=False)

    def restore(self, rank: int) -> None:
        net.set_link(self.name, self.host(rank), up=True)

    def is_cut(self, rank: int) -> bool:
        return not net.link_is_up(self.name, self.host(rank))

    def status(self) -> dict[str, Any]:
        state = self._state()
        for h in state["hosts"]:
            h["congestion"] = net.congestion_of(self.host(h["rank"]))
            h["slow_start_after_idle"] = net.slow_start_after_idle_of(self.host(h["rank"]))
            h["rate_bit"] = self.rate_of(h["rank"])
            h["link"] = "cut" if self.is_cut(h["rank"]) else "up"
        return state

    def _state(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "size": self.size,
            "rate_bit": self.rate_bit,
            "factors": {str(k): v for k, v in self.factors.items()},
            "loss": self.loss,
            "delay_us": self.delay_us,
            "subnet": self.subnet,
            "master_port": self.master_port,
            "congestion": self.congestion,
            "slow_start_after_idle": self.slow_start_after_idle,
            "switch_netns": net.switch_ns(self.name),
            "master_addr": self.master_addr,
            "hosts": [dict(vars(h)) for h in self.hosts],
        }

    def _save(self) -> None:
        net.write_state(self.name, self._state())

    def throughput(self, src: int, dst: int, seconds: float = 2.0) -> float:
        """TCP goodput (bit/s) of one stream from host src to host dst, measured by dst."""
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
            args = [*tool, "send", self.host(dst).addr, port, str(seconds)]
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
        env["GLOO_SOCKET_IFNAME"] = self.host(host).ifname  # the only NIC there
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.update(EMU_HOST=str(host), EMU_CLUSTER=self.name)
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

