"""The small-message fast path (issue 17), multi-process on shared memory.

- a small all_reduce runs on the caller's thread (STRAGG_INLINE_BYTES): an async_op Work is
  already complete when all_reduce returns, results are exact and bitwise identical on every
  rank; a large one still runs on the worker thread; with STRAGG_INLINE_BYTES=0 every call does;
- Auto runs recursive doubling ("rd") for tiny calls, including a group of 3 (fold/unfold), and
  its results on random floats (where the summation order shows in the bits) are bitwise
  identical on every rank; stragg.recent_calls records every call, inline or not.
"""

from __future__ import annotations

import hashlib
from typing import Any

import _harness as h
import pytest
import torch
import torch.distributed as dist

pytestmark = [pytest.mark.needs_backend, pytest.mark.stragg_only]


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def small_calls_worker(rank: int, ws: int) -> dict[str, Any]:
    import stragg

    out: dict[str, Any] = {}
    gen = torch.Generator().manual_seed(1000 + rank)
    # Tiny, random floats: the reduction order shows in the bits.
    rand = torch.rand(1000, generator=gen, dtype=torch.float32) - 0.5
    work = dist.all_reduce(rand, async_op=True)
    out["small_completed_on_return"] = work.is_completed()
    work.wait()
    out["random_digest"] = _digest(rand)
    # Exact integer data: small (inline) and large (worker) calls against the reference.
    exact = []
    for numel in (1, 7, 1000, 200_000):
        t = torch.arange(numel, dtype=torch.float32) * (rank + 1)
        w = dist.all_reduce(t, async_op=True)
        w.wait()
        want = torch.arange(numel, dtype=torch.float32) * (ws * (ws + 1) // 2)
        exact.append(bool(torch.equal(t, want)))
    out["exact"] = exact
    calls = stragg.recent_calls()
    out["plans"] = [c["plan"] for c in calls]
    out["bytes"] = [c["bytes"] for c in calls]
    out["ok"] = [c["ok"] for c in calls]
    return out


@pytest.mark.parametrize("ws", [2, 3, 4])
@pytest.mark.parametrize("inline_bytes", ["256KiB", "0"])
def test_small_calls_exact_identical_and_recorded(ws: int, inline_bytes: str) -> None:
    run = h.run_ranks(ws, small_calls_worker, env={"STRAGG_INLINE_BYTES": inline_bytes})
    values = run.values()
    digests = {v["random_digest"] for v in values}
    assert len(digests) == 1, f"ranks disagree bitwise on random floats: {digests}"
    for rank, v in enumerate(values):
        assert all(v["exact"]), f"rank {rank}: wrong results {v['exact']}"
        assert v["ok"] == [True] * 5, v
        assert v["bytes"] == [4000, 4, 28, 4000, 800_000], v
        # Tiny calls: recursive doubling (the cost model's pick for latency-bound sizes).
        assert v["plans"][0] == "rd", v["plans"]
        if inline_bytes != "0":
            assert v["small_completed_on_return"], f"rank {rank}: inline call not complete"


def profiled_calls_worker(rank: int, ws: int) -> dict[str, Any]:
    # Without a profiler the Work carries no title (no RecordFunction per call); under
    # torch.profiler every stragg all_reduce, inline or on the worker, is a named event.
    plain = torch.ones(8)
    dist.all_reduce(plain)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        small = torch.ones(8)
        dist.all_reduce(small)
        large = torch.ones(200_000)
        dist.all_reduce(large, async_op=True).wait()
        coalesced = [torch.ones(3), torch.ones(5)]
        dist.all_reduce_coalesced(coalesced)
    names = [e.name for e in prof.events()]
    return {
        "all_reduce_events": names.count("stragg:all_reduce"),
        "coalesced_events": names.count("stragg:all_reduce_coalesced"),
        "exact": bool(torch.equal(small, torch.full((8,), float(ws)))
                      and torch.equal(large, torch.full((200_000,), float(ws)))
                      and torch.equal(coalesced[1], torch.full((5,), float(ws)))),
    }


def test_profiler_names_stragg_calls() -> None:
    for rank, v in enumerate(h.run_ranks(2, profiled_calls_worker).values()):
        assert v["exact"], f"rank {rank}: wrong result under the profiler"
        assert v["all_reduce_events"] == 2, f"rank {rank}: {v}"
        assert v["coalesced_events"] == 1, f"rank {rank}: {v}"
