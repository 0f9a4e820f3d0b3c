"""dist.barrier on a stragg group (Session::barrier): a one-element all_reduce on stragg's own
transport, queued behind the calls issued before it.

- no rank leaves a barrier before the last one entered it (shared memory and TCP);
- an async barrier completes only after the async all_reduces issued before it (issue order);
- it counts in barrier_calls, not as an all_reduce (allreduce_calls, recent_calls) nor as a
  delegated op; on a subgroup only its members take part;
- a rank that never arrives is named, with the barrier's place among the calls, at the timeout;
- a group that delegates all_reduce (STRAGG_TRANSPORT=gloo) delegates its barrier too; one rank
  alone returns at once.
"""

from __future__ import annotations

import time
from typing import Any

import _harness as h
import pytest
import torch
import torch.distributed as dist

pytestmark = [pytest.mark.needs_backend, pytest.mark.stragg_only]

ENTRY_STAGGER_S = 0.3


def barrier_worker(rank: int, ws: int) -> dict[str, Any]:
    import stragg

    out: dict[str, Any] = {}
    dist.all_reduce(torch.ones(4))
    # Ordering: ranks enter one after another; everybody leaves after the last one entered.
    time.sleep(ENTRY_STAGGER_S * rank)
    out["entered"] = time.time()
    dist.barrier()
    out["left"] = time.time()

    # Issue order: a large async all_reduce (run on the worker thread) and then an async
    # barrier; when the barrier is done, so is the all_reduce.
    big = torch.full((1 << 21,), float(rank + 1))
    reduce_work = dist.all_reduce(big, async_op=True)
    barrier_work = dist.barrier(async_op=True)
    barrier_work.wait()
    out["all_reduce_done_at_barrier"] = reduce_work.is_completed()
    reduce_work.wait()
    out["big_exact"] = bool(torch.equal(big, torch.full_like(big, float(ws * (ws + 1) // 2))))

    # Counters and records.
    before_stats = h.backend_stats()
    before_calls = len(stragg.recent_calls())
    for _ in range(3):
        dist.barrier()
    out["stats"] = (before_stats, h.backend_stats())
    out["recent_calls_added"] = len(stragg.recent_calls()) - before_calls

    # A subgroup of ranks 0 and 1: its barrier does not involve rank 2.
    sub = dist.new_group([0, 1])
    if rank in (0, 1):
        dist.barrier(group=sub)
        out["sub_stats"] = h.backend_stats(sub)
    dist.barrier()
    return out


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_barrier_orders_ranks_and_calls(transport: str) -> None:
    run = h.run_ranks(3, barrier_worker, env={"STRAGG_TRANSPORT": transport})
    values = run.values()
    last_entry = max(v["entered"] for v in values)
    for rank, v in enumerate(values):
        assert v["left"] >= last_entry, (
            f"rank {rank} left the barrier at {v['left']:.3f}, before the last rank entered it "
            f"at {last_entry:.3f}"
        )
        assert v["all_reduce_done_at_barrier"], (
            f"rank {rank}: the async barrier completed before the all_reduce issued before it"
        )
        assert v["big_exact"], f"rank {rank}: wrong all_reduce result"
        before, after = v["stats"]
        assert after["transport"] == transport, after
        assert after["barrier_calls"] - before["barrier_calls"] == 3, (before, after)
        assert after["delegated_calls"] == before["delegated_calls"], (before, after)
        assert after["allreduce_calls"] == before["allreduce_calls"], (before, after)
        assert after["failed_calls"] == 0, after
        assert v["recent_calls_added"] == 0, v
        if rank in (0, 1):
            assert v["sub_stats"]["barrier_calls"] == 1, v["sub_stats"]
        else:
            assert "sub_stats" not in v


def absent_worker(rank: int, ws: int) -> dict[str, Any]:
    dist.all_reduce(torch.ones(4))
    dist.all_reduce(torch.ones(4))
    if rank == ws - 1:
        time.sleep(8.0)  # never calls the barrier; stays alive past the others' timeout
        return {"barrier": None}
    return {"barrier": h.capture(dist.barrier)}


def test_barrier_timeout_names_the_absent_rank() -> None:
    run = h.run_ranks(3, absent_worker, pg_timeout_s=3, timeout_s=120, destroy=False)
    for rank, v in enumerate(run.values()):
        out = v["barrier"]
        if rank == 2:
            continue
        assert not out.ok, f"rank {rank}: barrier returned without rank 2: {out}"
        assert out.is_instance("DistBackendError"), out
        assert f"stragg: rank {rank}: barrier after call #1" in out.msg, out
        assert "rank 2 has not called barrier after call #1 (its last was #1)" in out.msg, out


def delegated_worker(rank: int, ws: int) -> dict[str, Any]:
    before = h.backend_stats()
    dist.barrier()
    return {"stats": (before, h.backend_stats())}


def test_barrier_is_delegated_with_all_reduce() -> None:
    run = h.run_ranks(2, delegated_worker, env={"STRAGG_TRANSPORT": "gloo"})
    for rank, v in enumerate(run.values()):
        before, after = v["stats"]
        assert after["transport"] == "gloo", after
        assert after["delegated_calls"] - before["delegated_calls"] == 1, (rank, before, after)
        assert after["barrier_calls"] == before["barrier_calls"], (rank, before, after)


def single_worker(rank: int, ws: int) -> dict[str, Any]:
    dist.barrier()
    work = dist.barrier(async_op=True)
    work.wait()
    return {"stats": h.backend_stats()}


def test_barrier_on_one_rank() -> None:
    (v,) = h.run_ranks(1, single_worker).values()
    assert v["stats"]["barrier_calls"] == 2, v
