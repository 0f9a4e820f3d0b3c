"""Fault injection on one host (shared-memory transport), multi-process; every case is bounded by
the harness' deadline. The TCP transport's cases are in test_netns.py (two network namespaces).

- a SIGSTOPped rank: every survivor names it ("rank 3 stopped responding"), whoever timed out
  first; once continued, its own call fails with the same cause;
- an absent rank with MASTER_ADDR (rank 0 hosts the store): the others name it;
- the store's host killed during setup (raise at once, naming the store) and after it (the
  group keeps working; a new group names the store);
- destroy_process_group with async all_reduces pending: they complete (like Gloo), or fail with
  a clear error when a peer is gone;
- abort() on one rank, and an error in an all_reduce: every operation on the group, delegated
  ones included, raises at once on every rank with the original cause, also one already waiting;
- 2000 small calls and 10 groups created and destroyed: no /dev/shm entry, descriptor, thread
  or process left;
- strided, transposed, expanded and complex tensors: float64 reference, bitwise identical.
Mismatches, a rank that never calls all_reduce or init, and kill -9 are in
test_allreduce_faults.py.

STRAGG_FAULT_REPORT=<file> appends one JSON line per observed error (fault, rank, seconds,
message): what docs/faults.md quotes.
"""

from __future__ import annotations

import functools
import gc
import json
import multiprocessing as mp
import os
import signal
import threading
import time
from datetime import timedelta
from typing import Any

import _harness as h
import pytest
import torch
import torch.distributed as dist

pytestmark = [pytest.mark.needs_backend, pytest.mark.slow]

STRAGG = h.is_stragg()
# The process-group timeout of the cases where an error must come from the fault itself, not
# from that timeout; the error's message says which. Every run also has the harness' deadline,
# which catches a hang; no case bounds how fast the machine is.
PG_TIMEOUT_S = 60.0


def _report(fault: str, rank: int, out: h.Outcome) -> None:
    path = os.environ.get("STRAGG_FAULT_REPORT")
    if path and not out.ok:
        with open(path, "a", encoding="utf-8") as fh:
            line = {"fault": fault, "rank": rank, "seconds": round(out.elapsed_s, 3)}
            fh.write(json.dumps({**line, "message": out.msg}) + "\n")


def _raised(label: str, out: h.Outcome) -> None:
    assert not out.ok, f"{label}: expected an error, but the call returned ({out})"
    assert out.is_instance("RuntimeError"), f"{label}: expected a RuntimeError, got {out}"


def _pid_file(rank: int) -> str:
    return os.path.join(h.run_dir(), f"pid.{rank}")


def _publish_pid(rank: int) -> None:
    with open(_pid_file(rank), "w", encoding="utf-8") as fh:
        fh.write(str(os.getpid()))


def _read_pid(rank: int) -> int:
    with open(_pid_file(rank), encoding="utf-8") as fh:
        return int(fh.read())


# ----------------------------------------------------------------------------------------------
# A stopped rank (SIGSTOP: a debugger, a swapped-out or frozen host)
# ----------------------------------------------------------------------------------------------

STOPPED = 3


def stopped_rank_worker(rank: int, ws: int) -> dict[str, Any]:
    dist.all_reduce(torch.ones(8))
    _publish_pid(rank)
    x = torch.ones(50_000)
    if rank == STOPPED:
        # Stops itself from a timer thread while it runs a stream of all_reduces: wherever it is.
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGSTOP)).start()
        first = None
        for _ in range(100_000):
            out = h.capture(lambda: dist.all_reduce(x))
            if not out.ok:
                first = out
                break
        return {"after_continue": first}
    first = None
    for _ in range(100_000):
        out = h.capture(lambda: dist.all_reduce(x))
        if not out.ok:
            first = out
            break
    h.post("raised", rank)
    if rank == 0:  # everybody gave up: let the stopped rank run on
        h.wait_posted("raised", [r for r in range(ws) if r != STOPPED], timeout_s=60)
        os.kill(_read_pid(STOPPED), signal.SIGCONT)
    return {"first": first}


@pytest.mark.stragg_only
def test_a_stopped_rank_is_named_by_every_survivor() -> None:
    pg_timeout = 5.0
    run = h.run_ranks(4, stopped_rank_worker, pg_timeout_s=pg_timeout, timeout_s=150)
    values = run.values()
    for rank in range(4):
        if rank == STOPPED:
            continue
        first: h.Outcome = values[rank]["first"]
        _report("rank SIGSTOPped", rank, first)
        _raised(f"rank {rank}", first)
        assert f"rank {STOPPED} " in first.msg and "stopped responding" in first.msg, (
            f"rank {rank}: does not name rank {STOPPED} as stopped: {first}"
        )
        assert "is stopped: SIGSTOP or a debugger" in first.msg, first
    # The stopped rank, continued, fails too: with the same diagnosis.
    resumed: h.Outcome = values[STOPPED]["after_continue"]
    _report("rank SIGSTOPped, then continued", STOPPED, resumed)
    _raised("the continued rank", resumed)
    assert "aborted" in resumed.msg and f"rank {STOPPED} " in resumed.msg, resumed


# ----------------------------------------------------------------------------------------------
# The store: an absent rank when rank 0 hosts it, its host killed during and after setup
# ----------------------------------------------------------------------------------------------

ABSENT = 3


def master_addr_worker(rank: int, ws: int, port: int) -> dict[str, Any]:
    if rank == ABSENT:  # alive, never joins
        h.wait_posted("init_returned", [0, 1, 2], timeout_s=90)
        return {}
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(ws)
    )
    if STRAGG:
        import stragg  # noqa: F401

    timeout = timedelta(seconds=float(os.environ[h.PG_TIMEOUT_ENV]))
    out = h.capture(lambda: dist.init_process_group(h.backend_name(), timeout=timeout))
    h.post("init_returned", rank)
    return {"init": out}


@pytest.mark.stragg_only
def test_an_absent_rank_is_named_when_rank0_hosts_the_store() -> None:
    """env:// with MASTER_ADDR: rank 0's process hosts the TCPStore and waits in torch's TCPStore
    until all processes connected; it raises torch's 'N/4 clients joined' before stragg runs.
    The other ranks' stragg setup names the process that never started."""
    with h.reserved_ports() as (port,):  # rank 0's env:// TCPStore listens on it
        run = h.run_ranks(4, master_addr_worker, port, init=False, pg_timeout_s=5, timeout_s=150)
    values = run.values()
    rank0: h.Outcome = values[0]["init"]
    _report("absent rank, rank 0 hosts the store (torch's error on rank 0)", 0, rank0)
    _raised("rank 0", rank0)
    assert "clients joined" in rank0.msg, rank0
    for rank in (1, 2):
        out: h.Outcome = values[rank]["init"]
        _report("absent rank, rank 0 hosts the store", rank, out)
        _raised(f"rank {rank}", out)
        named = f"the process that never started is rank {ABSENT}" in out.msg
        store_gone = "lost the TCPStore at 127.0.0.1:" in out.msg and "see rank 0's error" in out.msg
        assert named or store_gone, f"rank {rank}: {out}"


def _host_store(port_queue: Any) -> None:
    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False)
    port_queue.put(store.port)
    threading.Event().wait()  # serves until the fixture kills this process


@pytest.fixture
def store_host() -> Any:
    """A TCPStore in a process of its own (so that it can be killed); yields (port, process)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_host_store, args=(q,), daemon=True)
    p.start()
    try:
        yield q.get(timeout=60), p
    finally:
        p.kill()
        p.join(30)


def _connect(port: int) -> Any:
    timeout = timedelta(seconds=float(os.environ[h.PG_TIMEOUT_ENV]))
    return dist.TCPStore("127.0.0.1", port, None, is_master=False, timeout=timeout)


def _wait_keys(store: Any, suffixes: list[str], timeout_s: float) -> bool:
    """Waits until the store holds, for every suffix, a key ending in it (under whatever prefix
    torch gives the group); False on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        keys = store.list_keys()
        if all(any(k.endswith(sfx) for k in keys) for sfx in suffixes):
            return True
        time.sleep(0.02)
    return False


def store_lost_in_setup_worker(rank: int, ws: int, port: int, host_pid: int) -> dict[str, Any]:
    if rank == ABSENT:
        # Ranks 0-2 published their setup records ("hello/<rank>", stragg's setup handshake):
        # they are in stragg's setup, waiting for this rank, which never comes. Kill the store.
        in_setup = _wait_keys(_connect(port), [f"/hello/{r}" for r in range(3)], timeout_s=60)
        os.kill(host_pid, signal.SIGKILL)
        h.wait_posted("init_returned", [0, 1, 2], timeout_s=90)
        return {"in_setup": in_setup}
    store = _connect(port)
    out = h.capture(functools.partial(h.init_process_group, rank, ws, store=store))
    h.post("init_returned", rank)
    return {"init": out}


@pytest.mark.stragg_only
def test_a_store_lost_during_setup_raises_at_once_naming_it(store_host: Any) -> None:
    port, proc = store_host
    run = h.run_ranks(
        4,
        store_lost_in_setup_worker,
        port,
        proc.pid,
        init=False,
        pg_timeout_s=PG_TIMEOUT_S,
        timeout_s=150,
    )
    values = run.values()
    assert values[ABSENT]["in_setup"], "ranks 0-2 never published their setup records"
    for rank, v in enumerate(values):
        if rank == ABSENT:
            continue
        out: h.Outcome = v["init"]
        _report("store host killed during setup", rank, out)
        _raised(f"rank {rank}", out)
        assert out.is_instance("DistStoreError"), out
        assert f"lost the TCPStore at 127.0.0.1:{port}" in out.msg, out
        # At once, not after the timeout: the message says so (no "timed out"), and it came
        # before the timeout could have fired.
        assert "timed out" not in out.msg, out
        assert out.elapsed_s < PG_TIMEOUT_S, f"rank {rank}: only at the timeout: {out}"


def _wait_dead(pid: int, timeout_s: float) -> bool:
    """Waits until process pid has exited (a zombie has closed its sockets); False on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = h._proc_stat(pid)
        if st is None or st[2] == "Z":
            return True
        time.sleep(0.02)
    return False


def store_lost_after_init_worker(rank: int, ws: int, port: int, host_pid: int) -> dict[str, Any]:
    h.init_process_group(rank, ws, store=_connect(port))
    dist.all_reduce(torch.ones(8))
    dist.barrier()
    if rank == 0:  # every rank finished its setup (the barrier): now the store goes
        os.kill(host_pid, signal.SIGKILL)
        if _wait_dead(host_pid, timeout_s=60):
            h.post("store_gone", 0)
    store_gone = h.wait_posted("store_gone", [0], timeout_s=90)
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    b = torch.full((4,), float(rank))
    dist.broadcast(b, src=1)
    dist.barrier()
    group = h.capture(lambda: dist.new_group(backend=h.backend_name()))
    return {"store_gone": store_gone, "sum": t[0].item(), "bcast": b.tolist(), "new_group": group}


@pytest.mark.stragg_only
def test_after_init_the_group_outlives_its_store(store_host: Any) -> None:
    port, proc = store_host
    run = h.run_ranks(
        4,
        store_lost_after_init_worker,
        port,
        proc.pid,
        init=False,
        pg_timeout_s=PG_TIMEOUT_S,
        timeout_s=150,
    )
    for rank, v in enumerate(run.values()):
        assert v["store_gone"], f"rank {rank}: the store's host never died: {v}"
        assert v["sum"] == 10.0 and v["bcast"] == [1.0] * 4, v
        out: h.Outcome = v["new_group"]
        _report("store host killed after init: new_group", rank, out)
        _raised(f"rank {rank} new_group", out)
        assert out.elapsed_s < PG_TIMEOUT_S, f"rank {rank}: new_group only at the timeout: {out}"


# ----------------------------------------------------------------------------------------------
# destroy_process_group with pending work
# ----------------------------------------------------------------------------------------------


def pending_at_destroy_worker(rank: int, ws: int) -> dict[str, Any]:
    sizes = [1, 1000, 300_000, 7, 2_000_000] * 4
    tensors = [torch.full((n,), float(rank + 1)) for n in sizes]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    dist.destroy_process_group()  # nothing waited for yet
    results = [h.capture(w.wait) for w in works]
    return {
        "ok": [r.ok for r in results],
        "errors": [r.msg for r in results if not r.ok],
        "values": [t[0].item() == ws * (ws + 1) / 2 and t[-1].item() == t[0].item() for t in tensors],
    }


def test_destroy_completes_pending_all_reduces() -> None:
    run = h.run_ranks(4, pending_at_destroy_worker, pg_timeout_s=60, timeout_s=150, destroy=False)
    for rank, v in enumerate(run.values()):
        assert all(v["ok"]), f"rank {rank}: pending works failed: {v['errors']}"
        assert all(v["values"]), f"rank {rank}: wrong results: {v['values']}"


GONE = 3


def peer_gone_at_destroy_worker(rank: int, ws: int) -> dict[str, Any]:
    dist.all_reduce(torch.ones(8))
    if rank == GONE:
        dist.all_reduce(torch.ones(2_000_000))
        os.kill(os.getpid(), signal.SIGKILL)
    tensors = [torch.ones(2_000_000) for _ in range(6)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    destroy = h.capture(dist.destroy_process_group)
    results = [h.capture(w.wait) for w in works]
    return {"destroy": destroy, "results": results}


@pytest.mark.stragg_only
def test_destroy_with_pending_work_and_a_dead_peer_fails_them_clearly() -> None:
    run = h.run_ranks(
        4, peer_gone_at_destroy_worker, pg_timeout_s=PG_TIMEOUT_S, timeout_s=150, destroy=False,
        check_leaks=False,
    )
    assert run[GONE].status == "died", run[GONE].describe()
    for rank in range(3):
        v = run[rank].value
        assert run[rank].ok, run[rank].describe()
        destroy: h.Outcome = v["destroy"]
        assert destroy.ok, f"rank {rank}: destroy_process_group raised: {destroy}"
        assert destroy.elapsed_s < PG_TIMEOUT_S, f"rank {rank}: destroy waited for the timeout"
        results: list[h.Outcome] = v["results"]
        failed = [r for r in results if not r.ok]
        assert failed, f"rank {rank}: every pending all_reduce succeeded without rank {GONE}"
        assert results[-1] in failed, f"rank {rank}: the last pending all_reduce succeeded"
        _report("destroy_process_group with pending works, a peer killed", rank, failed[0])
        assert f"rank {GONE} has died" in failed[0].msg, failed[0]
        for r in failed[1:]:
            assert "aborted" in r.msg and f"rank {GONE} has died" in r.msg, r
    run.assert_no_leaks()


# ----------------------------------------------------------------------------------------------
# Abort is total: every op, delegated ones too, on every rank, with the original cause
# ----------------------------------------------------------------------------------------------


def _every_op(rank: int, ws: int) -> dict[str, h.Outcome]:
    t = torch.ones(16)
    return {
        "all_reduce": h.capture(lambda: dist.all_reduce(t)),
        "broadcast": h.capture(lambda: dist.broadcast(t, src=0)),
        "all_gather": h.capture(lambda: dist.all_gather([torch.empty(16) for _ in range(ws)], t)),
        "barrier": h.capture(dist.barrier),
        "reduce_scatter": h.capture(
            lambda: dist.reduce_scatter_tensor(torch.empty(4), torch.ones(4 * ws))
        ),
    }


def abort_worker(rank: int, ws: int, wait_in: str) -> dict[str, Any]:
    dist.all_reduce(torch.ones(8))
    dist.barrier()
    if rank == 0:
        # Aborts once every other rank is inside the collective, waiting for rank 0.
        inside = h.wait_posted("inside", [r for r in range(ws) if r != 0], timeout_s=90)
        dist.group.WORLD.abort()
        return {"inside": inside, "waiting": None, "ops": _every_op(rank, ws)}
    h.post_when_inside("inside", rank, wait_in)
    if wait_in == "all_reduce":
        waiting = h.capture(lambda: dist.all_reduce(torch.ones(1000)))
    else:
        waiting = h.capture(dist.barrier)
    return {"inside": True, "waiting": waiting, "ops": _every_op(rank, ws)}


@pytest.mark.stragg_only
@pytest.mark.parametrize("wait_in", ["all_reduce", "barrier"])
def test_abort_fails_every_op_on_every_rank_at_once(wait_in: str) -> None:
    # The waiting ranks all wait in the same collective: ranks in different collectives at once
    # are a mismatch, which a rank may detect (and report) before rank 0's abort arrives.
    worker = functools.partial(abort_worker, wait_in=wait_in)
    run = h.run_ranks(4, worker, pg_timeout_s=PG_TIMEOUT_S, timeout_s=150, destroy=False)
    for rank, v in enumerate(run.values()):
        assert v["inside"], f"rank {rank}: the others never were inside the {wait_in}"
        if v["waiting"] is not None:
            w: h.Outcome = v["waiting"]
            _report("abort() on rank 0 while waiting", rank, w)
            _raised(f"rank {rank} waiting", w)
            assert w.elapsed_s < PG_TIMEOUT_S, f"rank {rank}: only at the timeout: {w}"
            assert "aborted: rank 0: abort() was called" in w.msg, w
        for op, out in v["ops"].items():
            _report(f"abort() on rank 0, then {op}", rank, out)
            _raised(f"rank {rank} {op}", out)
            assert out.elapsed_s < PG_TIMEOUT_S, f"rank {rank} {op}: only at the timeout: {out}"
            assert f"stragg: rank {rank}: " in out.msg and "aborted" in out.msg, out
            assert "aborted: rank 0: abort() was called" in out.msg, f"rank {rank} {op}: {out}"


def error_then_every_op_worker(rank: int, ws: int) -> dict[str, Any]:
    dist.all_reduce(torch.ones(8))
    issued = h.capture(lambda: dist.all_reduce(torch.ones(11 if rank == 1 else 10), async_op=True))
    if not issued.ok:  # a rank that saw the mismatch aborted the group before this one issued
        return {"bad": issued, "bad_future": None, "ops": _every_op(rank, ws)}
    work = issued.value
    bad = h.capture(work.wait)
    # The work's future is made when first asked for: asked after the failure, it carries it.
    bad_future = h.capture(lambda: work.get_future().wait())
    return {"bad": bad, "bad_future": bad_future, "ops": _every_op(rank, ws)}


@pytest.mark.stragg_only
def test_after_an_error_every_op_raises_at_once_with_the_cause() -> None:
    run = h.run_ranks(4, error_then_every_op_worker, pg_timeout_s=PG_TIMEOUT_S, timeout_s=150)
    for rank, v in enumerate(run.values()):
        _report("numel mismatch", rank, v["bad"])
        _raised(f"rank {rank} mismatch", v["bad"])
        if v["bad_future"] is not None:
            _raised(f"rank {rank} mismatch's future", v["bad_future"])
            assert "numel" in v["bad_future"].msg, f"rank {rank}: {v['bad_future']}"
        for op, out in v["ops"].items():
            _report(f"numel mismatch, then {op}", rank, out)
            _raised(f"rank {rank} {op} after the mismatch", out)
            assert out.elapsed_s < PG_TIMEOUT_S, f"rank {rank} {op}: only at the timeout: {out}"
            assert "aborted" in out.msg and "numel" in out.msg, f"rank {rank} {op}: {out}"
    # The ranks that detected the mismatch had issued the call: their futures were checked.
    assert any(v["bad_future"] is not None for v in run.values()), "no rank issued the bad call"


# ----------------------------------------------------------------------------------------------
# Many calls, many groups: nothing leaks
# ----------------------------------------------------------------------------------------------


def _resources() -> dict[str, int]:
    return {"fds": len(os.listdir("/proc/self/fd")), "threads": len(os.listdir("/proc/self/task"))}


def many_calls_worker(rank: int, ws: int) -> dict[str, Any]:
    for _ in range(20):  # warm-up: lazily created threads and buffers
        dist.all_reduce(torch.ones(4))
    before = _resources()
    ok = True
    for i in range(2000):
        n = 1 + i % 64
        t = torch.full((n,), float(rank + 1))
        if i % 3 == 0:
            dist.all_reduce(t, async_op=True).wait()
        else:
            dist.all_reduce(t)
        ok = ok and t[0].item() == ws * (ws + 1) / 2
    after_calls = _resources()
    for _ in range(10):
        g = dist.new_group(backend=h.backend_name())
        t = torch.ones(100)
        dist.all_reduce(t, group=g)
        ok = ok and t[0].item() == ws
        dist.destroy_process_group(g)
        del g
    gc.collect()
    after_groups = _resources()
    return {"ok": ok, "before": before, "after_calls": after_calls, "after_groups": after_groups}


def test_2000_small_calls_and_10_groups_leak_nothing() -> None:
    run = h.run_ranks(4, many_calls_worker, pg_timeout_s=60, timeout_s=240)  # + /dev/shm, procs
    for rank, v in enumerate(run.values()):
        assert v["ok"], f"rank {rank}: wrong results"
        assert v["after_calls"] == v["before"], f"rank {rank}: {v}"
        # Destroyed groups give back their descriptors and threads (Gloo's included).
        assert v["after_groups"]["fds"] <= v["before"]["fds"], f"rank {rank}: {v}"
        assert v["after_groups"]["threads"] <= v["before"]["threads"], f"rank {rank}: {v}"


# ----------------------------------------------------------------------------------------------
# Strided, expanded and complex tensors
# ----------------------------------------------------------------------------------------------


def _layouts(rank: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1234 + rank)
    base = torch.randn(6, 10, generator=g, dtype=torch.float64)
    return {
        "transposed": base.t().float(),
        "strided": base.float()[:, ::3],
        "channels_last": torch.randn(2, 3, 4, 5, generator=g).contiguous(
            memory_format=torch.channels_last
        ),
        "expanded": torch.randn(1, 7, generator=g).expand(5, 7),
        "complex_strided": torch.randn(8, 6, generator=g, dtype=torch.complex64)[::2, 1::2],
        "narrowed_int": torch.arange(100, dtype=torch.int64).reshape(10, 10)[2:7, 3:9] * (rank + 1),
    }


def layouts_worker(rank: int, ws: int) -> dict[str, Any]:
    out = {}
    for name, t in _layouts(rank).items():
        original = t.clone()
        # The elements of the view's base that the view does not cover must stay as they were
        # (a write-back of the reduced buffer must land on the view's elements only).
        base = t._base
        before = base.clone() if base is not None else None
        outside = None
        if base is not None and base.is_contiguous():
            outside = torch.ones(base.shape, dtype=torch.bool)
            offset = t.storage_offset() - base.storage_offset()
            outside.as_strided(t.size(), t.stride(), offset).fill_(False)
        dist.all_reduce(t)
        kept = None
        if outside is not None and bool(outside.any()):
            kept = torch.equal(base[outside], before[outside])
        out[name] = {"result": t.clone(), "digest": h.digest(t), "outside_kept": kept}
        assert original.shape == t.shape
    return out


@pytest.mark.stragg_only
def test_strided_expanded_and_complex_tensors_match_a_float64_reference() -> None:
    """(Plain Gloo returns wrong values for the [:, ::3] view and corrupts the heap on the
    expanded one.)"""
    ws = 4
    run = h.run_ranks(ws, layouts_worker, pg_timeout_s=60, timeout_s=150)
    values = run.values()
    for name in values[0]:
        inputs = [_layouts(r)[name] for r in range(ws)]
        ref = h.reference([t.contiguous() for t in inputs], "SUM")
        for rank in range(ws):
            got = values[rank][name]["result"]
            problem = h.compare(got.contiguous(), ref, "SUM", ws)
            assert problem is None, f"{name}, rank {rank}: {problem}"
            assert values[rank][name]["digest"] == values[0][name]["digest"], (
                f"{name}: rank {rank} differs bitwise from rank 0"
            )
            assert values[rank][name]["outside_kept"] in (None, True), (
                f"{name}, rank {rank}: all_reduce wrote outside the view"
            )
    # The strided views do leave elements of their base out, so the check above ran.
    assert values[0]["strided"]["outside_kept"] is True, values[0]["strided"]
    assert values[0]["complex_strided"]["outside_kept"] is True, values[0]["complex_strided"]


# ----------------------------------------------------------------------------------------------
# Re-creating the default group on the same store
# ----------------------------------------------------------------------------------------------


def recreate_worker(rank: int, ws: int) -> dict[str, Any]:
    store = dist.TCPStore(
        h.HOST,
        int(os.environ[h.STORE_PORT_ENV]),
        ws,
        is_master=False,
        timeout=timedelta(seconds=60),
    )
    sums = []
    for _ in range(3):
        h.init_process_group(rank, ws, store=store)
        t = torch.full((1000,), float(rank + 1))
        dist.all_reduce(t)
        g = dist.new_group(backend=h.backend_name())
        dist.all_reduce(t, group=g)
        sums.append(t[0].item())
        dist.destroy_process_group()
    return {"sums": sums}


@pytest.mark.stragg_only
def test_the_default_group_can_be_recreated_on_the_same_store() -> None:
    """destroy_process_group() then init_process_group() on the same store, three times: torch
    reuses the group's store prefix, so the earlier group's setup keys are still there; each
    incarnation must set up afresh (it once read the old shared-memory names)."""
    run = h.run_ranks(2, recreate_worker, init=False, destroy=False, pg_timeout_s=60)
    for rank, v in enumerate(run.values()):
        assert v["sums"] == [6.0] * 3, f"rank {rank}: {v}"
