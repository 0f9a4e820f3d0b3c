"""shrink_group and split_group on stragg groups (one host, shared memory; TCP and mixed in
test_shrink_hosts.py).

- examples/shrink_on_failure.py: rank 2 SIGKILLed, the survivors shrink and finish; their
  parameters equal a fresh 3-rank run from the failure step's checkpoint; Gloo refuses;
- three successive shrinks 4 -> 3 -> 2 -> 1 after kill -9: float64 reference, bitwise identical
  ranks, DDP and a DeviceMesh on the 3-rank group, nothing leaked (shm, fds, threads, processes);
- a rank killed while the others are still inside init_process_group (in the inner Gloo
  backend's setup): every survivor raises DistBackendError naming it, within the timeout; the
  inner Gloo's collectives still wait the group's whole timeout;
- a healthy group shrunk with SHRINK_DEFAULT / SHRINK_ABORT: the excluded rank, still alive, is
  told why when it uses the old group;
- errors, each named: an excluded rank calling shrink, a rank outside the group, excluding
  everyone, different ranks_to_exclude across survivors, a second death during the shrink (then
  a retry works), the store's host (rank 0) being the dead rank;
- split on the CPU path (ProcessGroup.split_group: torch's split_group itself needs an
  accelerator).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import _harness as h
import pytest
import torch
import torch.distributed as dist

pytestmark = [pytest.mark.needs_backend, pytest.mark.stragg_only]

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "shrink_on_failure.py"


def _resources() -> dict[str, int]:
    return {"fds": len(os.listdir("/proc/self/fd")), "threads": len(os.listdir("/proc/self/task"))}


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _fail_on_dead_peer() -> h.Outcome:
    """An all_reduce on the default group, which must raise (a peer is dead)."""
    return h.capture(lambda: dist.all_reduce(torch.ones(8)))


def _check_sum(group: Any, salt: int) -> dict[str, Any]:
    """all_reduce on `group` of float32 data vs a float64 reference; digest for bitwise checks."""
    ws, me = group.size(), group.rank()
    inputs = [torch.randn(1000, generator=torch.Generator().manual_seed(salt * 100 + r))
              for r in range(ws)]
    t = inputs[me].clone()
    dist.all_reduce(t, group=group)
    ref = torch.stack([x.double() for x in inputs]).sum(0)
    err = ((t.double() - ref).abs().max() / ref.abs().max()).item()
    return {"size": ws, "rank": me, "rel_err": err, "digest": h.digest(t)}


# ----------------------------------------------------------------------------------------------
# The example
# ----------------------------------------------------------------------------------------------


def _example(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


@pytest.mark.slow
def test_example_finishes_after_a_kill_and_matches_a_fresh_run(tmp_path: Path) -> None:
    done = _example("--json", "--rundir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    s = json.loads(done.stdout.strip().splitlines()[-1])
    assert s["survivors"] == [0, 1, 3], s
    assert "rank 2 has died" in s["error"], s
    assert s["identical_on_all_ranks"], s
    assert s["reference_max_rel_diff"] <= 1e-6, s
    assert s["recovery_s"] is not None and s["shrink_s"] is not None, s


@pytest.mark.slow
def test_example_with_gloo_shows_torchs_refusal(tmp_path: Path) -> None:
    done = _example("--backend", "gloo", "--no-check", "--rundir", str(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert "does not support shrinking" in done.stdout, done.stdout


# ----------------------------------------------------------------------------------------------
# Successive shrinks after kill -9, DDP and DeviceMesh on a shrunk group, no leaks
# ----------------------------------------------------------------------------------------------


def successive_worker(rank: int, ws: int) -> dict[str, Any]:
    dist.all_reduce(torch.ones(4))  # warm-up: lazily made threads and buffers
    out: dict[str, Any] = {"before": _resources(), "sums": [], "errors": []}
    # The highest rank of the current group dies each round: 4 -> 3 -> 2 -> 1.
    for round_ in range(3):
        group = dist.distributed_c10d._get_default_group()
        if group.rank() == group.size() - 1:
            _die()
        failed = _fail_on_dead_peer()
        out["errors"].append(failed.msg.splitlines()[0] if not failed.ok else "no error")
        dead = group.size() - 1
        group = dist.shrink_group([dead])
        out["sums"].append(_check_sum(group, round_))
    gc.collect()
    out["after"] = _resources()
    return out


def test_three_successive_shrinks_keep_working_and_leak_nothing() -> None:
    run = h.run_ranks(4, successive_worker, pg_timeout_s=60, timeout_s=240)  # + shm, processes
    survivor = run[0]
    assert survivor.ok, run.describe()
    for r in run.ranks[1:]:
        assert r.status == "died" and r.exitcode == -signal.SIGKILL, run.describe()
    v = survivor.value
    for i, err in enumerate(v["errors"]):
        assert f"rank {3 - i} has died" in err or "was aborted" in err, v["errors"]
    assert [s["size"] for s in v["sums"]] == [3, 2, 1], v["sums"]
    assert all(s["rel_err"] < 1e-6 for s in v["sums"]), v["sums"]
    assert v["after"]["fds"] <= v["before"]["fds"], v
    assert v["after"]["threads"] <= v["before"]["threads"], v


def ranks_agree_worker(rank: int, ws: int) -> dict[str, Any]:
    """4 -> 3: every survivor's result, DDP gradient and DeviceMesh all_reduce compared."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.nn.parallel import DistributedDataParallel as DDP

    # Rank 1 dies only once every rank is out of init_process_group: killed while another was
    # still inside it, the survivors' init would fail instead (a different test, below).
    h.post("up", rank)
    if rank == 1:
        assert h.wait_posted("up", range(4), timeout_s=90)
        _die()
    _fail_on_dead_peer()
    group = dist.shrink_group([1])
    out = _check_sum(group, 3)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 4))
    x = torch.randn(6, 16, generator=torch.Generator().manual_seed(group.rank()))
    model(x).sum().backward()
    out["grad"] = h.digest(model.module.weight.grad)
    mesh = DeviceMesh.from_group(group, "cpu")
    out["mesh"] = _check_sum(mesh.get_group(), 7)
    return out


def test_shrunk_group_under_ddp_and_a_device_mesh_is_bitwise_identical_on_every_rank() -> None:
    run = h.run_ranks(4, ranks_agree_worker, pg_timeout_s=60, timeout_s=180)
    vals = [r.value for r in run if r.ok]
    assert len(vals) == 3, run.describe()
    assert sorted(v["rank"] for v in vals) == [0, 1, 2]
    assert all(v["rel_err"] < 1e-6 for v in vals), vals
    assert len({v["digest"] for v in vals}) == 1 and len({v["grad"] for v in vals}) == 1, vals
    assert all(v["mesh"]["size"] == 3 and v["mesh"]["rel_err"] < 1e-6 for v in vals), vals
    assert len({v["mesh"]["digest"] for v in vals}) == 1, vals


# ----------------------------------------------------------------------------------------------
# A rank that dies while the others are still inside init_process_group
# ----------------------------------------------------------------------------------------------


def dies_in_init_worker(rank: int, ws: int, when: str) -> dict[str, Any]:
    """Rank 1 dies inside init_process_group while the others are still in theirs, in the inner
    Gloo backend's setup (its constructor, wrapped here): 0.2 s into it, after publishing its
    address, while ranks 2 and 3 start theirs 0.5 s late, so they connect to a dead rank or wait
    for it to connect (Gloo's own wait would be 5 x the timeout); or before publishing it."""
    real = dist.ProcessGroupGloo

    def gloo(*args: Any, **kwargs: Any) -> Any:
        if rank == 1:
            if when == "before_its_address":
                _die()
            threading.Thread(target=lambda: (time.sleep(0.2), _die()), daemon=True).start()
        elif rank >= 2:
            time.sleep(0.5)
        return real(*args, **kwargs)

    dist.ProcessGroupGloo = gloo  # type: ignore[misc]
    try:
        out = h.capture(lambda: h.init_process_group(rank, ws))
    finally:
        dist.ProcessGroupGloo = real  # type: ignore[misc]
    return {"ok": out.ok, "mro": out.exc_mro, "msg": out.msg}


@pytest.mark.parametrize("when", ["after_its_address", "before_its_address"])
def test_a_rank_dying_during_the_others_init_is_named_by_every_survivor(when: str) -> None:
    # A 10 s timeout: Gloo's own connect wait (50 s) would run into the harness's deadline.
    run = h.run_ranks(4, dies_in_init_worker, when, init=False, pg_timeout_s=10, timeout_s=45)
    assert run[1].status == "died" and run[1].exitcode == -signal.SIGKILL, run.describe()
    for r in (0, 2, 3):
        v = run[r].value
        assert run[r].ok and not v["ok"], run.describe()
        assert "DistBackendError" in v["mro"], v
        assert v["msg"].startswith(f"stragg: rank {r}: process group setup"), v
        assert "rank 1 has died (process or connection gone)" in v["msg"], v


def late_broadcast_worker(rank: int, ws: int) -> dict[str, Any]:
    t = torch.full((4,), float(rank + 1))
    if rank == 1:
        time.sleep(2.0)  # late by more than the fifth of the timeout the inner Gloo is built with
    out = h.capture(lambda: dist.broadcast(t, src=0))
    return {"ok": out.ok, "msg": out.msg, "value": t.tolist()}


def test_the_inner_gloo_keeps_the_groups_timeout_for_its_collectives() -> None:
    run = h.run_ranks(2, late_broadcast_worker, pg_timeout_s=5, timeout_s=120)
    for v in run.values():
        assert v["ok"] and v["value"] == [1.0] * 4, v


# ----------------------------------------------------------------------------------------------
# A healthy group: the excluded rank is alive and told why
# ----------------------------------------------------------------------------------------------


SHRINK_DEFAULT = dist.distributed_c10d.SHRINK_DEFAULT
SHRINK_ABORT = dist.distributed_c10d.SHRINK_ABORT


def healthy_worker(rank: int, ws: int, flags: int) -> dict[str, Any]:
    """A healthy group, an all_reduce in flight when the survivors shrink: with SHRINK_DEFAULT
    every rank joins it and it completes first; with SHRINK_ABORT rank 3 never joins it and the
    shrink fails it at once."""
    # 4 MiB: above STRAGG_INLINE_BYTES, so the call is queued and shrink_group runs meanwhile.
    pending = torch.full((1 << 20,), float(rank + 1))
    if rank == 3:
        if flags == SHRINK_DEFAULT:
            dist.all_reduce(pending)
        h.wait_posted("shrunk", [0, 1, 2], timeout_s=90)
        return {"old_group": h.capture(lambda: dist.all_reduce(torch.ones(4)))}
    work = dist.all_reduce(pending, async_op=True)
    h.post("issued", rank)  # nobody aborts the group before every survivor issued its call
    assert h.wait_posted("issued", [0, 1, 2], timeout_s=90)
    group = dist.shrink_group([3], shrink_flags=flags)
    out = _check_sum(group, 5)
    out["pending"] = h.capture(lambda: (work.wait(), pending[0].item())[1])
    h.post("shrunk", rank)
    return out


@pytest.mark.parametrize("flags", [SHRINK_DEFAULT, SHRINK_ABORT], ids=["default", "abort"])
def test_shrinking_a_healthy_group_tells_the_excluded_rank(flags: int) -> None:
    run = h.run_ranks(4, healthy_worker, flags, pg_timeout_s=60, timeout_s=180)
    vals = run.values()
    assert all(v["rel_err"] < 1e-6 and v["size"] == 3 for v in vals[:3]), vals
    assert len({v["digest"] for v in vals[:3]}) == 1
    for v in vals[:3]:
        pending: h.Outcome = v["pending"]
        if flags == SHRINK_DEFAULT:  # finished before the shrink, with rank 3's share
            assert pending.ok and pending.value == 10.0, pending
        else:
            assert not pending.ok and "shrink_group excluded rank 3" in pending.msg, pending
    old: h.Outcome = vals[3]["old_group"]
    assert not old.ok, old
    assert "shrink_group excluded rank 3" in old.msg, old


def subgroup_worker(rank: int, ws: int) -> dict[str, Any]:
    """A stragg subgroup of global ranks [1, 2, 3]; global rank 2 (its rank 1) dies."""
    sub = dist.new_group([1, 2, 3], backend="stragg")
    if rank == 0:
        return {}
    dist.all_reduce(torch.ones(4), group=sub)
    if rank == 2:
        _die()
    failed = h.capture(lambda: dist.all_reduce(torch.ones(4), group=sub))
    shrunk = dist.shrink_group([1], group=sub)
    out = _check_sum(shrunk, 11)
    out["failed"] = failed
    out["ranks"] = dist.get_process_group_ranks(shrunk)
    return out


def test_a_subgroup_shrinks_and_the_default_group_stays() -> None:
    run = h.run_ranks(4, subgroup_worker, pg_timeout_s=60, timeout_s=180, destroy=False)
    for rank in (1, 3):
        v = run[rank].value
        assert v is not None, run.describe()
        assert not v["failed"].ok and "rank 1 has died" in v["failed"].msg, v["failed"]
        assert v["ranks"] == [1, 3] and v["size"] == 2 and v["rel_err"] < 1e-6, v
    assert run[0].ok, run.describe()


# ----------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------


def bad_arguments_worker(rank: int, ws: int) -> dict[str, h.Outcome]:
    return {
        "self": h.capture(lambda: dist.shrink_group([rank])),
        "outside": h.capture(lambda: dist.shrink_group([ws + 2])),
        "everyone": h.capture(lambda: dist.shrink_group(list(range(ws)))),
        "after": h.capture(lambda: _check_sum(dist.distributed_c10d._get_default_group(), 1)),
    }


def test_bad_arguments_are_refused_and_the_group_keeps_working() -> None:
    run = h.run_ranks(3, bad_arguments_worker, pg_timeout_s=60, timeout_s=150)
    for rank, v in enumerate(run.values()):
        assert not v["self"].ok and "in the exclusion list" in v["self"].msg, v["self"]
        assert not v["outside"].ok and "out of bounds" in v["outside"].msg, v["outside"]
        assert not v["everyone"].ok and "Cannot exclude all" in v["everyone"].msg, v["everyone"]
        assert v["after"].ok and v["after"].value["rel_err"] < 1e-6, v["after"]


def backend_checks_worker(rank: int, ws: int) -> dict[str, h.Outcome]:
    """The backend's own checks (what a caller of Backend.shrink, bypassing torch's, sees)."""
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    # Nothing below communicates: without this barrier a rank can finish and exit while the
    # other is still completing Gloo's connection to it ("Connection closed by peer" in init).
    dist.barrier()
    return {
        "self": h.capture(lambda: backend.shrink([rank])),
        "outside": h.capture(lambda: backend.shrink([7])),
        "twice": h.capture(lambda: backend.shrink([1, 1])),
        "flags": h.capture(lambda: backend.shrink([1], 5)),
        "everyone": h.capture(lambda: backend.shrink([0, 1])),
        "empty": h.capture(lambda: backend.shrink([])),
        "supports": h.capture(lambda: (backend.supports_shrinking, backend.supports_splitting)),
    }


def test_the_backend_names_bad_requests_itself() -> None:
    run = h.run_ranks(2, backend_checks_worker, pg_timeout_s=60, timeout_s=150)
    for rank, v in enumerate(run.values()):
        assert f"stragg: rank {rank}: shrink_group: this rank is in ranks_to_exclude" in v["self"].msg
        assert "rank 7 in ranks_to_exclude is not in this group of 2 ranks" in v["outside"].msg
        assert "rank 1 appears twice" in v["twice"].msg, v["twice"]
        assert "shrink_flags 5 is neither" in v["flags"].msg, v["flags"]
        assert "excludes all 2 ranks of the group" in v["everyone"].msg, v["everyone"]
        assert "ranks_to_exclude is empty" in v["empty"].msg, v["empty"]
        assert v["supports"].value == (True, True), v["supports"]


def mismatch_worker(rank: int, ws: int) -> dict[str, Any]:
    if rank == 3:
        _die()
    _fail_on_dead_peer()
    excluded = [3] if rank != 2 else [1, 3]  # rank 2 disagrees
    return {"shrink": h.capture(lambda: dist.shrink_group(excluded))}


def test_different_ranks_to_exclude_are_named_not_a_hang() -> None:
    run = h.run_ranks(4, mismatch_worker, pg_timeout_s=60, timeout_s=150)
    for rank in range(3):
        out: h.Outcome = run[rank].value["shrink"]
        assert not out.ok, out
        assert "every survivor must exclude the same ranks" in out.msg, out
        assert "ranks_to_exclude=[1, 3]" in out.msg or "ranks_to_exclude=[3]" in out.msg, out


def second_death_worker(rank: int, ws: int) -> dict[str, Any]:
    if rank == 3:
        _die()
    _fail_on_dead_peer()
    if rank == 2:  # dies while the others are in the shrink, waiting for it
        h.wait_posted("shrinking", [0, 1], timeout_s=60)
        time.sleep(0.2)
        _die()
    h.post("shrinking", rank)
    first = h.capture(lambda: dist.shrink_group([3]))
    retry = h.capture(lambda: _check_sum(dist.shrink_group([2, 3]), 9))
    return {"first": first, "retry": retry}


def test_a_second_death_during_the_shrink_is_named_and_a_retry_works() -> None:
    run = h.run_ranks(4, second_death_worker, pg_timeout_s=60, timeout_s=150)
    for rank in (0, 1):
        v = run[rank].value
        assert v is not None, run.describe()
        first: h.Outcome = v["first"]
        assert not first.ok and "rank 2 died during the shrink" in first.msg, first
        assert "ranks_to_exclude=[2, 3]" in first.msg, first
        assert v["retry"].ok and v["retry"].value["size"] == 2, v["retry"]
        assert v["retry"].value["rel_err"] < 1e-6, v["retry"]


def store_host_worker(rank: int, ws: int, port: int) -> dict[str, Any]:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(ws))
    import stragg  # noqa: F401

    dist.init_process_group("stragg", timeout=timedelta(seconds=30))
    dist.all_reduce(torch.ones(4))
    if rank == 0:
        _die()
    _fail_on_dead_peer()
    return {"shrink": h.capture(lambda: dist.shrink_group([0]))}


def test_the_store_host_being_the_dead_rank_is_explained() -> None:
    with h.reserved_ports() as (port,):  # rank 0's env:// TCPStore listens on it
        run = h.run_ranks(3, store_host_worker, port, init=False, pg_timeout_s=30, timeout_s=150,
                          destroy=False)
    for rank in (1, 2):
        v = run[rank].value
        assert v is not None, run.describe()
        out: h.Outcome = v["shrink"]
        assert not out.ok, out
        assert "lives in the process of rank 0" in out.msg, out
        assert "dist.TCPStore in a process of its own" in out.msg, out


# ----------------------------------------------------------------------------------------------
# split on the CPU path
# ----------------------------------------------------------------------------------------------


def split_worker(rank: int, ws: int) -> dict[str, Any]:
    parent = dist.distributed_c10d._get_default_group()
    mine, other = ([0, 1], [2, 3]) if rank < 2 else ([2, 3], [0, 1])
    child = parent.split_group(mine, timeout=timedelta(seconds=60), group_name=f"pair{mine[0]}")
    outside = parent.split_group(other, timeout=timedelta(seconds=60), group_name="x")
    t = torch.full((10,), float(rank + 1))
    child.allreduce([t]).wait()
    backend = child._get_backend(torch.device("cpu"))
    return {"size": child.size(), "rank": child.rank(), "sum": t[0].item(),
            "outside": outside is None, "backend": backend.name()}


def test_split_builds_a_stragg_group_of_the_members_only() -> None:
    run = h.run_ranks(4, split_worker, pg_timeout_s=60, timeout_s=150)
    for rank, v in enumerate(run.values()):
        assert v["size"] == 2 and v["rank"] == rank % 2, v
        assert v["sum"] == (3.0 if rank < 2 else 7.0), v
        assert v["outside"] and v["backend"] == "stragg", v
