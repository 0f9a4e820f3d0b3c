"""Bad input and faults (issue item 6), multi-process.

- mismatched numel / dtype / op across ranks: RuntimeError on every rank naming the field;
- a rank that never calls all_reduce / never calls init_process_group: the others raise at the
  process-group timeout (not before: stragg waits for stragglers) naming the missing rank;
- a rank SIGKILLed mid-collective (or while the others wait for it): the others raise before the
  process-group timeout could fire, naming the dead rank;
- afterwards the group is unusable (later collectives raise, message contains "aborted");
- no process and no /dev/shm "stragg" entry survives (run_ranks + the autouse fixture check it).
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from typing import Any

import _harness as h
import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.needs_backend

STRAGG = h.is_stragg()
# No case bounds how fast the machine is: a hang is caught by the harness' deadline, and an error
# that must not come from the process-group timeout must come before that timeout could fire.
DEAD_PEER_PG_TIMEOUT_S = 60.0


def _assert_runtime_error(label: str, out: h.Outcome) -> None:
    assert not out.ok, f"{label}: expected a RuntimeError, but the call returned ({out})"
    assert out.is_instance("RuntimeError"), f"{label}: expected RuntimeError, got {out}"


def _assert_aborted(label: str, out: h.Outcome) -> None:
    if not STRAGG:
        return  # gloo does not abort a group after an error
    _assert_runtime_error(label + " (collective after the error)", out)
    assert "aborted" in out.msg.lower(), f"{label}: later collective should say 'aborted': {out}"


# ----------------------------------------------------------------------------------------------
# Mismatched arguments
# ----------------------------------------------------------------------------------------------


MISMATCH_FIELDS = ("numel", "dtype", "op")
MISMATCH_PG_TIMEOUT_S = 30.0


def mismatch_worker(rank: int, ws: int) -> dict[str, Any]:
    """Each mismatch runs on its own fresh group (a group is unusable after its first error)."""
    out: dict[str, Any] = {}
    for field in MISMATCH_FIELDS:
        group = dist.new_group(backend=h.backend_name())
        warm = torch.ones(8)
        dist.all_reduce(warm, group=group)
        assert warm.tolist() == [float(ws)] * 8
        numel, dtype, op = 10, torch.float32, dist.ReduceOp.SUM
        if rank == 1:  # the odd one out
            if field == "numel":
                numel = 11
            elif field == "dtype":
                dtype = torch.int32  # same element size: a byte-level transport would not notice
            else:
                op = dist.ReduceOp.MAX
        t = torch.ones(numel, dtype=dtype)
        first = h.capture(functools.partial(dist.all_reduce, t, op=op, group=group))
        after = h.capture(functools.partial(dist.all_reduce, torch.ones(4), group=group))
        out[field] = {"first": first, "after": after}
    return out


@pytest.fixture(scope="module")
def mismatch_run() -> h.RunResult:
    return h.run_ranks(
        3, mismatch_worker, pg_timeout_s=MISMATCH_PG_TIMEOUT_S, timeout_s=120, check_leaks=False
    )


@pytest.mark.stragg_only
@pytest.mark.parametrize("field", MISMATCH_FIELDS)
def test_mismatch_raises_on_every_rank(mismatch_run: h.RunResult, field: str) -> None:
    values = mismatch_run.values()
    for rank, v in enumerate(values):
        first: h.Outcome = v[field]["first"]
        _assert_runtime_error(f"rank {rank}, {field} mismatch", first)
        msg = first.msg.lower()
        assert "mismatch" in msg, f"rank {rank}: message does not say 'mismatch': {first}"
        assert field in msg, f"rank {rank}: message does not name {field!r}: {first}"
        assert first.elapsed_s < MISMATCH_PG_TIMEOUT_S, (
            f"rank {rank}: detected only by the timeout: {first}"
        )
        _assert_aborted(f"rank {rank}", v[field]["after"])


@pytest.mark.stragg_only
def test_mismatch_leaves_nothing_behind(mismatch_run: h.RunResult) -> None:
    mismatch_run.values()
    mismatch_run.assert_no_leaks()


# ----------------------------------------------------------------------------------------------
# A rank that never calls all_reduce
# ----------------------------------------------------------------------------------------------

MISSING = 3


def missing_in_allreduce_worker(rank: int, ws: int) -> dict[str, Any]:
    warm = torch.ones(8)
    dist.all_reduce(warm)  # everybody is connected and healthy
    if rank == MISSING:
        # Alive, but never calls the collective; leave once the others have given up.
        gave_up = h.wait_posted("raised", [r for r in range(ws) if r != MISSING], timeout_s=90)
        return {"absent": True, "others_gave_up": gave_up}
    t = torch.ones(1024)
    first = h.capture(lambda: dist.all_reduce(t))
    h.post("raised", rank)
    after = h.capture(lambda: dist.all_reduce(torch.ones(4)))
    return {"first": first, "after": after}


@pytest.mark.slow
def test_rank_that_never_calls_allreduce() -> None:
    pg_timeout = 5.0
    run = h.run_ranks(
        4, missing_in_allreduce_worker, pg_timeout_s=pg_timeout, timeout_s=150, check_leaks=False
    )
    values = run.values()
    assert values[MISSING]["others_gave_up"], "the other ranks never returned from the all_reduce"
    for rank in range(4):
        if rank == MISSING:
            continue
        first: h.Outcome = values[rank]["first"]
        _assert_runtime_error(f"rank {rank}", first)
        if STRAGG:
            # a straggler-tolerant backend must not give up before the timeout
            assert first.elapsed_s >= 0.8 * pg_timeout, (
                f"rank {rank}: raised before the timeout: {first}"
            )
            assert f"rank {MISSING}" in first.msg, (
                f"rank {rank}: message does not name rank {MISSING}: {first}"
            )
        _assert_aborted(f"rank {rank}", values[rank]["after"])
    run.assert_no_leaks()


# ----------------------------------------------------------------------------------------------
# A rank that never calls init_process_group
# ----------------------------------------------------------------------------------------------


def missing_in_init_worker(rank: int, ws: int) -> dict[str, Any]:
    others = [r for r in range(ws) if r != MISSING]
    if rank == MISSING:
        gave_up = h.wait_posted("init_returned", others, timeout_s=90)
        return {"absent": True, "others_gave_up": gave_up}
    out = h.capture(lambda: h.init_process_group(rank, ws))
    h.post("init_returned", rank)
    return {"init": out, "initialized": dist.is_initialized()}


@pytest.mark.slow
def test_rank_that_never_calls_init_process_group() -> None:
    pg_timeout = 5.0
    run = h.run_ranks(
        4,
        missing_in_init_worker,
        init=False,
        pg_timeout_s=pg_timeout,
        timeout_s=150,
        check_leaks=False,
    )
    values = run.values()
    assert values[MISSING]["others_gave_up"], (
        "the other ranks never returned from init_process_group"
    )
    for rank in range(4):
        if rank == MISSING:
            continue
        out: h.Outcome = values[rank]["init"]
        _assert_runtime_error(f"rank {rank} init_process_group", out)
        if STRAGG:
            assert f"rank {MISSING}" in out.msg, (
                f"rank {rank}: message does not name rank {MISSING}: {out}"
            )
    run.assert_no_leaks()


# ----------------------------------------------------------------------------------------------
# A rank killed mid-collective
# ----------------------------------------------------------------------------------------------

VICTIM = 3
BIG = 4 * (1 << 20) + 1  # 16 MiB + 4 bytes of float32: many pipelined chunks


def killed_rank_worker(rank: int, ws: int, when: str) -> dict[str, Any]:
    warm = torch.ones(8)
    dist.all_reduce(warm)
    big = torch.ones(BIG)
    if rank == VICTIM:
        if when == "mid_collective":
            # Die from a timer thread while this rank is inside a stream of large all_reduces.
            threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
            for _ in range(50):
                dist.all_reduce(big)
        else:  # "while_waited_for": once the others are inside the all_reduce it never joins
            h.wait_posted("inside", [r for r in range(ws) if r != VICTIM], timeout_s=90)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(30)  # not reached: SIGKILL
        return {"survived": True}
    t0 = time.monotonic()
    first: h.Outcome | None = None
    iterations = 0
    h.post_when_inside("inside", rank, "all_reduce")
    for i in range(50):
        out = h.capture(lambda: dist.all_reduce(big))
        if not out.ok:
            first = out
            iterations = i
            break
    since_start = time.monotonic() - t0
    after = h.capture(lambda: dist.all_reduce(torch.ones(4)))
    return {"first": first, "iterations": iterations, "since_start": since_start, "after": after}


@pytest.mark.slow
@pytest.mark.parametrize("when", ["mid_collective", "while_waited_for"])
def test_rank_killed(when: str) -> None:
    run = h.run_ranks(
        4,
        killed_rank_worker,
        when,
        pg_timeout_s=DEAD_PEER_PG_TIMEOUT_S,
        timeout_s=180,
        check_leaks=False,
    )
    victim = run[VICTIM]
    assert victim.status == "died" and victim.exitcode == -signal.SIGKILL, victim.describe()
    for rank in range(4):
        if rank == VICTIM:
            continue
        r = run[rank]
        assert r.ok, r.describe()
        first: h.Outcome | None = r.value["first"]
        assert first is not None, (
            f"rank {rank}: every all_reduce succeeded although rank {VICTIM} was killed"
        )
        _assert_runtime_error(f"rank {rank}", first)
        assert r.value["since_start"] < DEAD_PEER_PG_TIMEOUT_S, (
            f"rank {rank}: the dead peer was noticed only at the timeout: {first}"
        )
        if STRAGG:
            assert f"rank {VICTIM}" in first.msg, (
                f"rank {rank}: message does not name rank {VICTIM}: {first}"
            )
        _assert_aborted(f"rank {rank}", r.value["after"])
    run.assert_no_leaks()


# ----------------------------------------------------------------------------------------------
# The harness itself: a hung rank never hangs pytest, and leftovers are caught
# ----------------------------------------------------------------------------------------------


def hang_worker(rank: int, ws: int) -> int:
    if rank == 1:
        time.sleep(3600)
    return rank


def orphan_worker(rank: int, ws: int) -> int:
    import subprocess

    return subprocess.Popen(["sleep", "3600"]).pid


def test_harness_kills_hung_ranks_on_its_deadline() -> None:
    t0 = time.monotonic()
    with pytest.raises(h.HarnessTimeout) as info:
        h.run_ranks(2, hang_worker, init=False, timeout_s=10)
    assert time.monotonic() - t0 < 40
    text = str(info.value)
    assert "did not finish within 10s" in text
    assert "[still running] rank 1: killed" in text, text
    # (rank 0 normally finished; on a very loaded machine it may still have been starting up)
    assert "[finished] rank 0: ok" in text or "[still running] rank 0: killed" in text, text


def test_harness_reports_processes_a_rank_left_behind() -> None:
    run = h.run_ranks(2, orphan_worker, init=False, timeout_s=60, check_leaks=False)
    orphans = sorted(run.values())
    assert sorted(run.stray_pids) == orphans
    with pytest.raises(h.LeakError, match="survived"):
        run.assert_no_leaks()
    for pid in orphans:  # they were killed by the harness
        st = h._proc_stat(pid)
        assert st is None or st[2] == "Z", f"stray {pid} still alive"


def shm_leaking_worker(rank: int, ws: int) -> str:
    name = f"stragg-{os.getpid()}-harnesstest-r{rank}"
    with open(os.path.join(h.SHM_DIR, name), "wb") as fh:
        fh.write(b"x")
    return name


def test_harness_reports_shm_a_rank_left_behind() -> None:
    run = h.run_ranks(2, shm_leaking_worker, init=False, timeout_s=60, check_leaks=False)
    names = sorted(run.values())
    try:
        assert run.leaked_shm == names
        with pytest.raises(h.LeakError, match="/dev/shm"):
            run.assert_no_leaks()
    finally:
        for n in names:
            os.unlink(os.path.join(h.SHM_DIR, n))
