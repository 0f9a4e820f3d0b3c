"""The process half of stragg.emucluster: a Job is a set of processes, one or more per emulated
host, whose output is streamed line by line with a "[label] " prefix, and which is killed as a
whole (every descendant, also those that started their own session, as torchrun's workers do).

Each process is started in its own session, and, where util-linux's setpriv is available, with a
parent-death signal (SIGKILL), so that it dies with the launcher even if the launcher itself is
SIGKILLed. The death signal fires when the *thread* that started it exits: start jobs from a
thread that outlives them (the main thread, normally).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections import deque
from typing import IO, TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from typing_extensions import Self


KEEP_LINES = 20000  # per process, for JobResult.output()
log = logging.getLogger("stragg.emucluster")


@dataclasses.dataclass
class ProcSpec:
    label: str  # "h1" or "h1.0" (host 1, local rank 0)
    host: int
    argv: list[str]
    env: dict[str, str]


@dataclasses.dataclass
class JobResult:
    labels: list[str]
    returncodes: list[int | None]  # as Popen reports them (negative: killed by that signal)
    timed_out: bool
    first_failure: str | None  # label of the process that failed first (not killed by us)
    killed: list[str]  # labels of the processes this job killed (fail-fast, timeout, Ctrl-C)
    outputs: list[str]

    @property
    def worst(self) -> int:
        """0 if every process exited 0; 124 on timeout; else the largest exit status (a
        signal s counts as 128 + s, as in a shell) among the processes the job did not kill
        itself (fail-fast kills the others after a failure: the failure is the status)."""
        if self.timed_out:
            return 124
        codes = [
            255 if c is None else (128 - c if c < 0 else c)
            for label, c in zip(self.labels, self.returncodes)
            if label not in self.killed
        ]
        return max(codes, default=0 if not self.killed else 128 + 15)

    @property
    def ok(self) -> bool:
        return self.worst == 0

    def output(self, label: str) -> str:
        return self.outputs[self.labels.index(label)]

    def describe(self, tail_chars: int = 2000) -> str:
        parts = []
        for label, code, out in zip(self.labels, self.returncodes, self.outputs):
            parts.append(f"--- {label}: exit {code}\n{out[-tail_chars:]}")
        return "\n".join(parts)


def _pdeathsig_prefix() -> list[str]:
    if shutil.which("setpriv") is None:
        return []
    return ["setpriv", "--pdeathsig", "KILL", "--"]


class Job:
    """Processes started together; see EmuCluster.spawn."""

    def __init__(
        self,
        specs: list[ProcSpec],
        output: IO[str] | None = None,
        on_exit: Callable[[Job], None] | None = None,
    ) -> None:
        self.specs = specs
        self.labels = [s.label for s in specs]
        self._sink = output
        self._sink_lock = threading.Lock()
        self._lines: list[deque] = [deque(maxlen=KEEP_LINES) for _ in specs]
        self._killed: set[int] = set()
        self._on_exit = on_exit
        self._finished = False
        self.procs: list[subprocess.Popen] = []
        self._pumps: list[threading.Thread] = []
        width = max((len(s.label) for s in specs), default=0)
        try:
            for i, spec in enumerate(specs):
                p = subprocess.Popen(
                    _pdeathsig_prefix() + spec.argv,
                    env=spec.env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                self.procs.append(p)
                prefix = f"[{spec.label}]".ljust(width + 2) + " "
                t = threading.Thread(target=self._pump, args=(i, p, prefix), daemon=True)
                t.start()
                self._pumps.append(t)
        except BaseException:
            self.kill()
            raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def _pump(self, i: int, proc: subprocess.Popen, prefix: str) -> None:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace")
            self._lines[i].append(line)
            if self._sink is not None:
                with self._sink_lock:
                    try:
                        self._sink.write(
                            prefix + line if line.endswith("\n") else prefix + line + "\n"
                        )
                        self._sink.flush()
                    except (OSError, ValueError):
                        pass
        proc.stdout.close()

    def poll(self) -> list[int | None]:
        return [p.poll() for p in self.procs]

    def running(self) -> bool:
        return any(c is None for c in self.poll())

    def output(self, label: str) -> str:
        return "".join(self._lines[self.labels.index(label)])

    def wait(
        self,
        timeout: float | None = None,
        fail_fast: bool = True,
        fail_grace: float = 5.0,
    ) -> JobResult:
        """Waits for every process. fail_fast: once one exits non-zero, the others get
        fail_grace seconds to finish (to report their own error), then are killed. timeout:
        everything still running then is killed and the result says timed_out."""
        start = time.monotonic()
        first_failure: int | None = None
        failed_at = 0.0
        timed_out = False
        try:
            while self.running():
                now = time.monotonic()
                if first_failure is None:
                    for i, code in enumerate(self.poll()):
                        if code not in (None, 0):
                            first_failure, failed_at = i, now
                            break
                if fail_fast and first_failure is not None and now - failed_at >= fail_grace:
                    self.kill()
                    break
                if timeout is not None and now - start >= timeout:
                    timed_out = True
                    self.kill()
                    break
                time.sleep(0.02)
        except BaseException:
            self.kill()
            raise
        self._finish()
        if first_failure is None:
            codes = self.poll()
            first_failure = next(
                (i for i, c in enumerate(codes) if c not in (None, 0) and i not in self._killed),
                None,
            )
        return JobResult(
            labels=list(self.labels),
            returncodes=self.poll(),
            timed_out=timed_out,
            first_failure=None if first_failure is None else self.labels[first_failure],
            killed=[self.labels[i] for i in sorted(self._killed)],
            outputs=["".join(lines) for lines in self._lines],
        )

    def kill(self, grace: float = 3.0) -> None:
        """SIGTERM to every process of the job and all their descendants, SIGKILL to what is
        left after `grace` seconds; reaps the job's own processes."""
        live = [i for i, p in enumerate(self.procs) if p.poll() is None]
        self._killed.update(live)
        kill_tree([self.procs[i].pid for i in live], grace)
        self._finish()

    def _finish(self) -> None:
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILLed already
                pass
        for t in self._pumps:
            t.join(timeout=5)
        if not self._finished:
            self._finished = True
            if self._on_exit is not None:
                self._on_exit(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


# ---------------------------------------------------------------------------------------------
# Process trees


def _snapshot() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, sid, state) of every process."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(entry)] = (int(fields[1]), int(fields[3]), fields[0])
        except (OSError, IndexError, ValueError):
            continue
    return out


def _grow(known: set[int], sessions: set[int], snap: dict[int, tuple[int, int, str]]) -> None:
    """Adds to `known` every descendant of it and every member of its sessions."""
    changed = True
    while changed:
        changed = False
        for pid, (ppid, sid, _) in snap.items():
            if pid not in known and (ppid in known or sid in sessions):
                known.add(pid)
                changed = True
            if pid in known and sid == pid and sid not in sessions:
                sessions.add(sid)  # a descendant that leads its own session (torchrun workers)
                changed = True


def kill_tree(roots: list[int], grace: float = 3.0) -> None:
    """Terminates the processes `roots` (each leads its own session) and all their descendants."""
    mine = {os.getpid(), 1, 0}
    known, sessions = set(roots) - mine, set(roots) - mine
    for sig, wait_s in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        snap = _snapshot()
        _grow(known, sessions, snap)
        known -= mine
        for pid in known:
            if pid in snap and snap[pid][2] != "Z":
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            snap = _snapshot()
            _grow(known, sessions, snap)
            known -= mine
            if not any(pid in snap and snap[pid][2] != "Z" for pid in known):
                return
            time.sleep(0.05)
    log.warning("emucluster: processes %s survived SIGKILL", sorted(known))
