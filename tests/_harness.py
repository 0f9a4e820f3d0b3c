"""Multi-process test harness for the stragg torch.distributed backend.

``run_ranks(world_size, fn, *args)`` starts ``world_size`` processes, gives them a rendezvous
(a TCPStore hosted by the calling process on a port the kernel picked, so there is no free-port
race), calls ``init_process_group`` in each, runs ``fn(rank, world_size, *args)`` and returns
what every rank returned or raised.

Guarantees the tests rely on:
- pytest never hangs: a global deadline kills every child (and its process group) and raises
  ``HarnessTimeout`` naming the ranks that did not finish and the stage each one was in;
- every child is joined and no process started by a child survives the run (each child leads its
  own process group, which is scanned and killed);
- ``/dev/shm`` entries whose name contains "stragg" that appeared during the run and did not go
  away are reported (``RunResult.leaked_shm``; ``check_leaks=True`` turns them into a failure).

The backend name comes from ``STRAGG_TEST_BACKEND`` (default "stragg") so the harness and the tests
can be validated against plain "gloo".

Processes start from a fork server that has imported torch once (importing torch takes seconds
per process on 2 cores); each child then takes the parent's whole environment at its start, as a
spawned one would. Where the environment differs from the server's in anything a process reads
while importing (anything but STRAGG_*, PYTEST_* and the harness' own variables), the run
spawns instead.

``fn`` must be a module-level (picklable) function. Values it returns are pickled with the plain
``pickle`` module in the child, so tensors travel by value, never through shared memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import multiprocessing as mp
import os
import pickle
import re
import shutil
import signal
import subprocess
import socket
import sys
import tempfile
import threading
import time
import traceback
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_connections
from typing import Any

import torch

SHM_DIR = "/dev/shm"
SHM_MARKER = "stragg"
HOST = "127.0.0.1"
RUN_DIR_ENV = "STRAGG_TEST_RUN_DIR"
BACKEND_ENV = "STRAGG_TEST_BACKEND"
STORE_PORT_ENV = "STRAGG_TEST_STORE_PORT"
PG_TIMEOUT_ENV = "STRAGG_TEST_PG_TIMEOUT_S"

# Seconds every child may wait at the harness' pre-init barrier (covers the skew of importing
# torch in N processes on 2 cores, so that a small process-group timeout only measures the test).
_PREINIT_BARRIER_S = 120.0


# --------------------------------------------------------------------------------------------
# Backend selection
# --------------------------------------------------------------------------------------------


def backend_name() -> str:
    """The backend under test: $STRAGG_TEST_BACKEND or "stragg"."""
    return os.environ.get(BACKEND_ENV, "stragg").strip() or "stragg"


def is_stragg(backend: str | None = None) -> bool:
    return (backend or backend_name()) == "stragg"


def stragg_import_error() -> str | None:
    """None when ``import stragg`` works in this interpreter, else the reason."""
    try:
        import stragg  # noqa: F401
    except Exception as exc:  # noqa: BLE001  # pragma: no cover - depends on the build
        return f"{type(exc).__name__}: {exc}"
    return None


def cannot(reason: str) -> None:
    """What a test needs is missing here: skips it, or FAILS it under STRAGG_TEST_REQUIRE=1 (CI,
    where everything the suite needs is installed: a missing piece is a broken CI there)."""
    import pytest

    if os.environ.get("STRAGG_TEST_REQUIRE") == "1":
        pytest.fail(f"STRAGG_TEST_REQUIRE=1 and {reason}")
    pytest.skip(reason)


def backend_stats(group: Any = None) -> dict[str, Any]:
    """``stragg.backend_stats(group)`` (only meaningful when the backend is stragg)."""
    import stragg

    stats = stragg.backend_stats(group)
    return dict(stats)


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


class HarnessTimeout(AssertionError):
    """The run did not finish before its global deadline; every child was killed."""


class LeakError(AssertionError):
    """Processes or /dev/shm segments survived a run."""


@dataclasses.dataclass
class RankResult:
    rank: int
    status: str  # "ok" | "error" | "died" | "killed"
    value: Any = None
    exc_mro: list[str] = dataclasses.field(default_factory=list)
    exc_msg: str = ""
    traceback: str = ""
    stage: str = "not started"  # last stage the child reported
    exitcode: int | None = None
    destroy_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def raised(self) -> bool:
        return self.status == "error"

    def is_instance(self, name: str) -> bool:
        """Whether the raised exception is an instance of the class called ``name``."""
        return name in self.exc_mro

    def describe(self) -> str:
        if self.status == "ok":
            extra = (
                f" (destroy_process_group raised: {self.destroy_error})"
                if self.destroy_error
                else ""
            )
            return f"rank {self.rank}: ok{extra}"
        if self.status == "error":
            return (
                f"rank {self.rank}: raised {self.exc_mro[0] if self.exc_mro else '?'} at stage "
                f"{self.stage!r}: {self.exc_msg}\n{self.traceback}"
            )
        return (
            f"rank {self.rank}: {self.status} (exitcode {self.exitcode}, last stage {self.stage!r})"
        )


@dataclasses.dataclass
class RunResult:
    ranks: list[RankResult]
    backend: str
    elapsed_s: float
    leaked_shm: list[str]
    stray_pids: list[int]

    def __getitem__(self, rank: int) -> RankResult:
        return self.ranks[rank]

    def __iter__(self) -> Iterator[RankResult]:
        return iter(self.ranks)

    def __len__(self) -> int:
        return len(self.ranks)

    def describe(self) -> str:
        return "\n".join(r.describe() for r in self.ranks)

    def values(self) -> list[Any]:
        """Every rank's return value; AssertionError (with every rank's story) if one failed."""
        bad = [r for r in self.ranks if not r.ok or r.destroy_error]
        assert not bad, f"{len(bad)} rank(s) failed (backend {self.backend}):\n{self.describe()}"
        return [r.value for r in self.ranks]

    def assert_no_leaks(self) -> None:
        assert_no_leaks(self.leaked_shm, self.stray_pids)


def assert_no_leaks(leaked_shm: Iterable[str], stray_pids: Iterable[int]) -> None:
    shm = sorted(leaked_shm)
    pids = sorted(stray_pids)
    problems = []
    if shm:
        problems.append(f"/dev/shm entries left behind: {shm}")
    if pids:
        problems.append(f"processes that survived the run (killed now): {pids}")
    if problems:
        raise LeakError("; ".join(problems))


# --------------------------------------------------------------------------------------------
# Leak detection helpers
# --------------------------------------------------------------------------------------------


def shm_entries(marker: str = SHM_MARKER) -> set[str]:
    """Names in /dev/shm that contain ``marker`` (case-insensitive)."""
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:  # pragma: no cover - non-Linux
        return set()
    return {n for n in names if marker.lower() in n.lower()}


def wait_shm_clean(
    before: set[str], grace_s: float = 3.0, keep: Callable[[set[str]], set[str]] | None = None
) -> list[str]:
    """New /dev/shm entries (vs ``before``; only those ``keep`` returns) still present after
    ``grace_s`` seconds."""
    deadline = time.monotonic() + grace_s
    while True:
        new = shm_entries() - before
        if keep is not None:
            new = keep(new)
        if not new or time.monotonic() >= deadline:
            return sorted(new)
        time.sleep(0.1)


_SHM_PID = re.compile(r"stragg-(\d+)-")


def _attributable(names: Iterable[str], pids: Iterable[int]) -> list[str]:
    """Drop entries that name a creator pid outside ``pids`` (another user's concurrent run).

    stragg names its segments "stragg-<creator pid>-..."; names without a pid are kept.
    """
    wanted = set(pids)
    out = []
    for n in names:
        m = _SHM_PID.search(n)
        if m is None or int(m.group(1)) in wanted:
            out.append(n)
    return sorted(out)


# Every rank process run_ranks started in this test process (their segments are this run's).
STARTED_PIDS: set[int] = set()


def own_entries(names: set[str]) -> set[str]:
    """The entries this test process made: named by no pid, by this process, by a rank that
    run_ranks started, or by a live descendant (a torchrun job's rank). Another user's run on
    the same machine is not this test's leak."""
    me = os.getpid()
    out = set()
    for n in names:
        m = _SHM_PID.search(n)
        pid = int(m.group(1)) if m else None
        if pid is None or pid == me or pid in STARTED_PIDS or _descends_from(pid, me):
            out.add(n)
    return out


def _descends_from(pid: int, ancestor: int) -> bool:
    for _ in range(64):
        st = _proc_stat(pid)
        if st is None:
            return False
        if st[0] == ancestor:
            return True
        if st[0] <= 1:
            return False
        pid = st[0]
    return False


def _proc_stat(pid: int) -> tuple[int, int, str] | None:
    """(ppid, pgid, state) of a live process, None if gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            data = fh.read()
    except OSError:
        return None
    # comm may contain spaces/parentheses: split after the last ')'.
    rest = data[data.rfind(")") + 2 :].split()
    state, ppid, pgid = rest[0], int(rest[1]), int(rest[2])
    return ppid, pgid, state


def _wait_dead(pids: Iterable[int], timeout_s: float) -> None:
    """Poll until every pid is gone or a zombie (or ``timeout_s`` passes)."""
    pending = set(pids)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        pending = {pid for pid in pending if (st := _proc_stat(pid)) is not None and st[2] != "Z"}
        if pending:
            time.sleep(0.01)


def _all_pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def processes_in_groups(pgids: Iterable[int]) -> list[int]:
    """Live (non-zombie) processes whose process group is one of ``pgids``."""
    wanted = set(pgids)
    found = []
    for pid in _all_pids():
        st = _proc_stat(pid)
        if st is not None and st[1] in wanted and st[2] != "Z":
            found.append(pid)
    return found


def child_pids(parent: int | None = None) -> set[int]:
    """Live (non-zombie) direct children of ``parent`` (default: this process)."""
    parent = os.getpid() if parent is None else parent
    out = set()
    for pid in _all_pids():
        st = _proc_stat(pid)
        if st is not None and st[0] == parent and st[2] != "Z":
            out.add(pid)
    return out


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


# --------------------------------------------------------------------------------------------
# Ports for rendezvous that the test cannot hand a port-0 listener (env://, torchrun's static
# rendezvous: every process must know the port before rank 0 / the agent listens on it)
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def reserved_ports(n: int = 1, host: str = HOST) -> Iterator[list[int]]:
    """``n`` ports the kernel picked, held while the context lasts: each stays bound by a socket
    of this process (SO_REUSEADDR, never listening), so no other bind(port 0) and no outgoing
    connection is given it, while a server that binds it with SO_REUSEADDR, as torch's TCPStore
    does, can still listen on it. (Bind, close, then pass the port on would leave it free for
    anybody in between.)"""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, 0))
        yield [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


# --------------------------------------------------------------------------------------------
# Cross-process signalling inside one run (files in a per-run temporary directory)
# --------------------------------------------------------------------------------------------


def run_dir() -> str:
    path = os.environ.get(RUN_DIR_ENV)
    if not path:
        raise RuntimeError(f"{RUN_DIR_ENV} is not set: not running under run_ranks")
    return path


def post(name: str, rank: int) -> None:
    """Tell the other ranks of this run that ``rank`` reached point ``name``."""
    path = os.path.join(run_dir(), f"{name}.{rank}")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(str(time.time()))


def wait_posted(name: str, ranks: Iterable[int], timeout_s: float) -> bool:
    """Wait until every rank in ``ranks`` posted ``name``; False on timeout."""
    wanted = [os.path.join(run_dir(), f"{name}.{r}") for r in ranks]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(os.path.exists(p) for p in wanted):
            return True
        time.sleep(0.02)
    return False


def post_when_inside(name: str, rank: int, *functions: str, timeout_s: float = 90.0) -> None:
    """Posts ``name`` for ``rank`` as soon as this process's main thread is inside one of the
    torch.distributed ``functions`` (e.g. "all_reduce", "barrier"), seen by a thread that watches
    its stack: another rank can then wait (``wait_posted``) until this one is in the collective,
    not merely about to call it. Call it right before the call."""
    main = threading.main_thread().ident
    wanted = set(functions)

    def inside() -> bool:
        frame = sys._current_frames().get(main)  # type: ignore[arg-type]
        while frame is not None:
            code = frame.f_code
            if code.co_name in wanted and f"torch{os.sep}distributed" in code.co_filename:
                return True
            frame = frame.f_back
        return False

    def watch() -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if inside():
                post(name, rank)
                return
            time.sleep(0.005)

    threading.Thread(target=watch, name=f"post-{name}", daemon=True).start()


def init_process_group(
    rank: int, world_size: int, backend: str | None = None, store: Any = None
) -> None:
    """init_process_group on the run's rendezvous (for workers started with ``init=False``)."""
    import torch.distributed as dist

    backend = backend or backend_name()
    timeout = timedelta(seconds=float(os.environ[PG_TIMEOUT_ENV]))
    if store is None:
        store = dist.TCPStore(
            HOST, int(os.environ[STORE_PORT_ENV]), world_size, is_master=False, timeout=timeout
        )
    if backend == "stragg":
        import stragg  # noqa: F401  (registers the backend)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)


# --------------------------------------------------------------------------------------------
# Small helpers used by worker functions
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    """What one call did: returned a value, or raised (type names, message), and how long it took."""

    ok: bool
    elapsed_s: float
    value: Any = None
    exc_mro: list[str] = dataclasses.field(default_factory=list)
    msg: str = ""

    def is_instance(self, name: str) -> bool:
        return name in self.exc_mro

    def __str__(self) -> str:
        if self.ok:
            return f"returned after {self.elapsed_s:.2f}s"
        return f"raised {self.exc_mro[:1]} after {self.elapsed_s:.2f}s: {self.msg}"


def capture(call: Callable[[], Any]) -> Outcome:
    """Run ``call()``; return an Outcome instead of raising."""
    t0 = time.monotonic()
    try:
        value = call()
    except BaseException as exc:  # noqa: BLE001 - we report every kind of failure
        return Outcome(
            ok=False,
            elapsed_s=time.monotonic() - t0,
            exc_mro=[c.__name__ for c in type(exc).__mro__],
            msg=str(exc),
        )
    return Outcome(ok=True, elapsed_s=time.monotonic() - t0, value=value)


def digest(t: torch.Tensor) -> str:
    """sha256 of the tensor's raw bytes in logical (row-major) order, plus dtype and shape."""
    flat = t.detach().contiguous().reshape(-1)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    raw = flat.view(torch.uint8) if flat.numel() else flat.to(torch.uint8)
    h = hashlib.sha256(raw.numpy().tobytes())
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# The child side
# --------------------------------------------------------------------------------------------


def _set_pdeathsig() -> None:
    """Ask the kernel to SIGKILL this child if the test process dies (Linux only)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


def _send(conn: Connection, *msg: Any) -> None:
    with contextlib.suppress(Exception):
        conn.send(msg)


def _child_main(
    rank: int,
    world_size: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    backend: str,
    store_port: int,
    do_init: bool,
    pg_timeout_s: float,
    destroy: bool,
    conn: Connection,
    environ: Mapping[str, str] | None = None,
) -> None:
    if environ is not None:  # forked from the server: the parent's environment, as spawn has it
        os.environ.clear()
        os.environ.update(environ)
    os.setpgid(0, 0)
    _set_pdeathsig()
    import torch.distributed as dist

    stage = "connect store"
    _send(conn, "stage", stage)
    initialized = False
    try:
        store = dist.TCPStore(
            HOST, store_port, world_size, is_master=False, timeout=timedelta(seconds=pg_timeout_s)
        )
        # Pre-init barrier with a long timeout: absorbs the skew of importing torch in N
        # processes, so pg_timeout_s only ever measures what the test does.
        stage = "pre-init barrier"
        _send(conn, "stage", stage)
        if store.add("harness/arrived", 1) == world_size:
            store.set("harness/go", "1")
        store.wait(["harness/go"], timedelta(seconds=_PREINIT_BARRIER_S))
        if do_init:
            stage = "init_process_group"
            _send(conn, "stage", stage)
            init_process_group(rank, world_size, backend, store=store)
            initialized = True
        stage = "fn"
        _send(conn, "stage", stage)
        value = fn(rank, world_size, *args)
        payload = pickle.dumps(value)
        _send(conn, "result", "ok", payload)
    except BaseException as exc:  # noqa: BLE001
        _send(
            conn,
            "result",
            "error",
            pickle.dumps(
                ([c.__name__ for c in type(exc).__mro__], str(exc), traceback.format_exc(), stage)
            ),
        )
    destroy_error = None
    if destroy and (initialized or dist.is_initialized()):
        _send(conn, "stage", "destroy_process_group")
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except BaseException as exc:  # noqa: BLE001
            destroy_error = f"{type(exc).__name__}: {exc}"
    _send(conn, "stage", "exiting")
    _send(conn, "done", destroy_error)
    conn.close()


# --------------------------------------------------------------------------------------------
# The parent side
# --------------------------------------------------------------------------------------------

# The environment the fork server was started with (None: not started yet).
_SERVER_ENV: dict[str, str] | None = None
# What a child gets in any case: the harness's defaults.
_CHILD_DEFAULTS = {"OMP_NUM_THREADS": "1"}


def _forkserver_env() -> dict[str, str]:
    """Starts the fork server (torch imported once) and returns the environment it has."""
    global _SERVER_ENV
    if _SERVER_ENV is None:
        from multiprocessing import forkserver

        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "torch.distributed", "pytest", "_harness"])
        with _patched_environ(_CHILD_DEFAULTS):
            forkserver.ensure_running()
            _SERVER_ENV = dict(os.environ)
    return _SERVER_ENV


def forkserver_pid() -> int | None:
    """The fork server's pid once started (a long-lived helper of the test process)."""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    return pid if isinstance(pid, int) else None


def _start_method(env: Mapping[str, str]) -> str:
    """forkserver when ``env`` differs from the server's only where nothing reads at import."""
    server = _forkserver_env()
    own = {RUN_DIR_ENV, BACKEND_ENV, STORE_PORT_ENV, PG_TIMEOUT_ENV}
    for k in set(env) | set(server):
        if env.get(k) != server.get(k) and not (k.startswith(("STRAGG_", "PYTEST_")) or k in own):
            return "spawn"
    return "forkserver"


@contextlib.contextmanager
def _patched_environ(env: Mapping[str, str | None]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in env}
    try:
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_ranks(
    world_size: int,
    fn: Callable[..., Any],
    *args: Any,
    backend: str | None = None,
    timeout_s: float = 180.0,
    env: Mapping[str, str | None] | None = None,
    init: bool | Iterable[int] = True,
    pg_timeout_s: float = 60.0,
    destroy: bool = True,
    check_leaks: bool = True,
) -> RunResult:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` spawned processes.

    backend: process-group backend (default: $STRAGG_TEST_BACKEND or "stragg").
    timeout_s: global deadline for the whole run; on expiry every child is SIGKILLed and
        ``HarnessTimeout`` is raised.
    env: extra environment for the children (None values remove a variable). Applied before the
        children start, so it is seen by ``import torch``.
    init: True (every rank calls init_process_group), False (none), or the ranks that do.
    pg_timeout_s: ``timeout`` given to init_process_group (and to the store client).
    destroy: call destroy_process_group after fn (its error, if any, lands in destroy_error).
    check_leaks: raise LeakError when processes or /dev/shm "stragg" entries survive the run
        (otherwise they are only reported in the RunResult).
    """
    import torch.distributed as dist

    backend = backend or backend_name()
    if isinstance(init, bool):
        init_ranks = set(range(world_size)) if init else set()
    else:
        init_ranks = set(init)

    shm_before = shm_entries()
    store = dist.TCPStore(
        HOST, 0, world_size, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
    )
    tmp = tempfile.mkdtemp(prefix="harness-run-")
    child_env: dict[str, str | None] = {
        RUN_DIR_ENV: tmp,
        BACKEND_ENV: backend,
        STORE_PORT_ENV: str(store.port),
        PG_TIMEOUT_ENV: str(pg_timeout_s),
    }
    child_env.update(env or {})

    with _patched_environ({**_CHILD_DEFAULTS, **child_env}):
        method = _start_method(dict(os.environ))
    ctx = mp.get_context(method)
    procs: list[Any] = []
    stray: list[int] = []
    rank_pids: set[int] = set()
    conns: dict[int, Connection] = {}
    results: dict[int, RankResult] = {
        r: RankResult(rank=r, status="died") for r in range(world_size)
    }
    done: set[int] = set()
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    timed_out = False
    try:
        with _patched_environ({**_CHILD_DEFAULTS, **child_env}):
            environ = dict(os.environ) if method == "forkserver" else None
            for rank in range(world_size):
                reader, writer = ctx.Pipe(duplex=False)
                p = ctx.Process(
                    target=_child_main,
                    args=(
                        rank,
                        world_size,
                        fn,
                        args,
                        backend,
                        store.port,
                        rank in init_ranks,
                        pg_timeout_s,
                        destroy,
                        writer,
                        environ,
                    ),
                    name=f"rank{rank}",
                )
                p.start()
                writer.close()
                procs.append(p)
                conns[rank] = reader

        open_conns = dict(conns)
        while open_conns:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            ready = wait_connections(list(open_conns.values()), timeout=min(remaining, 1.0))
            for rank, c in list(open_conns.items()):
                if c not in ready:
                    continue
                try:
                    msg = c.recv()
                except (EOFError, OSError):
                    del open_conns[rank]
                    continue
                _apply_message(results[rank], msg, done)
        # Every pipe is closed (children exited or are exiting): join within the deadline.
        for p in procs:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            p.join(remaining)
            if p.is_alive():
                timed_out = True
                break
    finally:
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        rank_pids = {p.pid for p in procs if p.pid is not None}
        STARTED_PIDS.update(rank_pids)
        # Anything else still alive in a rank's process group was started by that rank and
        # survived it (or it would die with the group below): a stray.
        stray = [pid for pid in processes_in_groups(rank_pids) if pid not in rank_pids]
        for p in procs:
            if p.pid is not None:
                _kill_group(p.pid)  # the rank and whatever it started...
                with contextlib.suppress(Exception):
                    p.kill()  # ...and the rank itself if it had not yet made its own group
        for p in procs:
            p.join(10)
        for rank, p in enumerate(procs):
            res = results[rank]
            res.exitcode = p.exitcode
            if rank in hung:
                res.status = "killed"
            elif res.status == "died" and rank in done:  # pragma: no cover - defensive
                res.status = "ok"
        for pid in processes_in_groups(rank_pids):  # e.g. a process that left the group's session
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # SIGKILL takes effect asynchronously: on a loaded machine a killed process can still
        # be runnable for a moment. Wait until it is really gone, so "killed" means dead.
        _wait_dead(set(stray) | set(processes_in_groups(rank_pids)), timeout_s=10.0)
        for c in conns.values():
            c.close()
        shutil.rmtree(tmp, ignore_errors=True)
        del store

    elapsed = time.monotonic() - t0
    run = RunResult(
        ranks=[results[r] for r in range(world_size)],
        backend=backend,
        elapsed_s=elapsed,
        leaked_shm=[],
        stray_pids=stray,
    )
    if timed_out:
        fn_name = getattr(fn, "__name__", fn)
        lines = [
            (
                f"run_ranks({world_size}, {fn_name}) on backend {backend!r} did not finish within "
                f"{timeout_s:g}s; every child was killed. Per rank:"
            )
        ]
        for r in run.ranks:
            state = "still running" if r.status == "killed" else "finished"
            lines.append(f"  [{state}] {r.describe()}")
        raise HarnessTimeout("\n".join(lines))
    run.leaked_shm = _attributable(wait_shm_clean(shm_before), rank_pids)
    if check_leaks:
        run.assert_no_leaks()
    return run


def _apply_message(res: RankResult, msg: Any, done: set[int]) -> None:
    kind = msg[0]
    if kind == "stage":
        res.stage = msg[1]
    elif kind == "result":
        if msg[1] == "ok":
            res.status = "ok"
            res.value = pickle.loads(msg[2])
        else:
            mro, text, tb, stage = pickle.loads(msg[2])
            res.status = "error"
            res.exc_mro, res.exc_msg, res.traceback, res.stage = mro, text, tb, stage
    elif kind == "done":
        res.destroy_error = msg[1]
        done.add(res.rank)


# --------------------------------------------------------------------------------------------
# Deterministic inputs and float64 / exact references for all_reduce
# --------------------------------------------------------------------------------------------

FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INT_DTYPES = (torch.int8, torch.uint8, torch.int32, torch.int64)
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + (torch.bool,)

# (rtol, atol relative to the largest |reference| value) per floating dtype.
_TOL = {
    torch.float64: 1e-12,
    torch.float32: 2e-6,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def dtype_from_name(name: str) -> torch.dtype:
    dt = getattr(torch, name)
    assert isinstance(dt, torch.dtype), name
    return dt


def _gen(seed: int, rank: int, salt: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + rank * 7919 + salt) % (2**63))
    return g


def make_input(
    rank: int, world_size: int, numel: int, dtype: torch.dtype, op: str, seed: int
) -> torch.Tensor:
    """Deterministic input of ``rank`` for ``op`` (a ReduceOp name) on ``dtype``.

    Values are chosen so that the exact result is representable in ``dtype`` for every world
    size up to 8: no integer overflow, and small multiples of 1/4 for the 16-bit floats (so any
    summation order gives the same exact partial sums there).
    """
    g = _gen(seed, rank, numel * 131 + zlib.crc32(op.encode()) % 997 + ALL_DTYPES.index(dtype))
    n = numel
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if op == "PRODUCT":
        # Each element has one "owner" rank holding a value in [-3, 3] (>=1 for uint8); every
        # other rank holds +-1, so |product| <= 3 for any world size.
        idx = torch.arange(n)
        owner = (idx + seed) % world_size == rank
        if dtype == torch.uint8:
            big = torch.randint(1, 4, (n,), generator=g)
            small = torch.ones(n, dtype=torch.int64)
        else:
            big = torch.randint(-3, 4, (n,), generator=g)
            small = torch.randint(0, 2, (n,), generator=g) * 2 - 1
        return torch.where(owner, big, small).to(dtype)
    if dtype in INT_DTYPES:
        if op in ("BAND", "BOR", "BXOR"):
            info = torch.iinfo(dtype)
            lo, hi = (
                (0, 256)
                if dtype == torch.uint8
                else (max(info.min, -(2**31)), min(info.max, 2**31 - 1))
            )
            v = torch.randint(lo, hi, (n,), generator=g)
            if dtype == torch.int64:
                v = v * (2**31) + torch.randint(0, 2**31, (n,), generator=g)
            return v.to(dtype)
        if dtype == torch.int8:
            return torch.randint(-15, 16, (n,), generator=g).to(dtype)
        if dtype == torch.uint8:
            return torch.randint(0, 32, (n,), generator=g).to(dtype)
        if dtype == torch.int32:
            return torch.randint(-(2**27), 2**27, (n,), generator=g).to(dtype)
        # int64: values near 2**58 so that a float64 path would lose the low bits.
        return (
            torch.randint(-(2**20), 2**20, (n,), generator=g) * (2**38)
            + torch.randint(-(2**30), 2**30, (n,), generator=g)
        ).to(dtype)
    # floating point
    if dtype in (torch.float32, torch.float64) and op not in ("MIN", "MAX"):
        return torch.randn(n, generator=g, dtype=torch.float64).to(dtype)
    if op in ("MIN", "MAX"):
        return torch.randn(n, generator=g, dtype=torch.float64).to(dtype)
    return (torch.randint(-16, 17, (n,), generator=g).to(torch.float64) / 4).to(dtype)


PREMUL_FACTOR = {
    torch.float32: 1.0 / 3.0,
    torch.float64: 1.0 / 3.0,
    torch.float16: 0.5,
    torch.bfloat16: 0.5,
}


def reference(inputs: list[torch.Tensor], op: str, world_size: int | None = None) -> torch.Tensor:
    """Reference result of all_reduce(op) over ``inputs``: float64 for floats, exact for ints."""
    ws = world_size or len(inputs)
    dtype = inputs[0].dtype
    if dtype == torch.bool:
        stack = torch.stack(inputs)
        if op in ("SUM", "MAX", "BOR"):
            return stack.any(0)
        if op in ("PRODUCT", "MIN", "BAND"):
            return stack.all(0)
        if op == "BXOR":
            return stack.to(torch.int64).sum(0) % 2 == 1
        raise ValueError(op)
    if dtype in INT_DTYPES:
        stack = torch.stack([t.to(torch.int64) for t in inputs])
        if op == "SUM":
            return stack.sum(0)
        if op == "AVG":
            return torch.div(stack.sum(0), ws, rounding_mode="trunc")
        if op == "MIN":
            return stack.min(0).values
        if op == "MAX":
            return stack.max(0).values
        if op == "PRODUCT":
            return stack.prod(0)
        acc = stack[0].clone()
        for t in stack[1:]:
            acc = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[
                op
            ](acc, t)
        return acc
    if dtype.is_complex:
        stack = torch.stack([t.to(torch.complex128) for t in inputs])
        assert op == "SUM", op
        return stack.sum(0)
    stack = torch.stack([t.to(torch.float64) for t in inputs])
    if op == "SUM":
        return stack.sum(0)
    if op == "AVG":
        return stack.sum(0) / ws
    if op == "PREMUL_SUM":
        return stack.sum(0) * PREMUL_FACTOR[dtype]
    if op == "MIN":
        return stack.min(0).values
    if op == "MAX":
        return stack.max(0).values
    if op == "PRODUCT":
        return stack.prod(0)
    raise ValueError(op)


def compare(result: torch.Tensor, ref: torch.Tensor, op: str, world_size: int) -> str | None:
    """None if ``result`` matches ``ref`` within the dtype's tolerance, else a description."""
    dtype = result.dtype
    if tuple(result.shape) != tuple(ref.shape):
        return f"shape {tuple(result.shape)} != reference {tuple(ref.shape)}"
    if result.numel() == 0:
        return None
    exact = dtype == torch.bool or dtype in INT_DTYPES or op in ("MIN", "MAX")
    if exact:
        want = ref.to(dtype) if dtype == torch.bool else ref
        got = (
            result
            if dtype == torch.bool
            else result.to(torch.int64 if dtype in INT_DTYPES else torch.float64)
        )
        want = want if dtype == torch.bool else want.to(got.dtype)
        bad = (got != want).nonzero()
        if bad.numel():
            i = tuple(bad[0].tolist())
            return (
                f"{bad.shape[0]} of {result.numel()} elements differ (exact dtype/op); first at {i}: "
                f"got {got[i].item()} want {want[i].item()}"
            )
        return None
    if dtype.is_complex:
        got = torch.view_as_real(result.to(torch.complex128))
        want = torch.view_as_real(ref)
        tol = _TOL[torch.float32]
    else:
        got = result.to(torch.float64)
        want = ref
        tol = _TOL[dtype]
    scale = max(1.0, float(want.abs().max()))
    # Each of the (world_size - 1) combining steps may round once; allow for that.
    rtol = tol * max(2, world_size)
    atol = rtol * scale
    err = (got - want).abs()
    bad = err > atol + rtol * want.abs()
    if bool(bad.any()):
        k = int(bad.reshape(-1).nonzero()[0])
        return (
            f"{int(bad.sum())} of {result.numel()} elements outside tolerance (rtol {rtol:g}, "
            f"atol {atol:g}); max err {float(err.max()):g}; first flat index {k}: got "
            f"{got.reshape(-1)[k].item()} want {want.reshape(-1)[k].item()}"
        )
    return None


def python_info() -> str:
    return f"python {sys.version.split()[0]}, torch {torch.__version__}"


def run_module(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, module: str = "stragg.info"
):
    """`python -m module *args` from tmp_path (outside the source tree: the installed stragg),
    without the STRAGG_* settings of this process."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("STRAGG_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=tmp_path,  # outside the source tree: the installed stragg
        env=full_env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
