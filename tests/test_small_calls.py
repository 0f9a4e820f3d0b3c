"""The small-message fast path (issue 17), multi-process on shared memory.

- a small all_reduce runs on the caller's thread (STRAGG_INLINE_BYTES): an async_op Work is
  already complete when all_reduce returns, results are exact and bitwise identical on every
  rank; a large one still runs on the worker thread; with STRAGG_INLINE_BYTES=0 every call does;
- Auto runs the one-shot all_reduce ("oneshot") for tiny calls on one host, and recursive
  doubling ("rd") with STRAGG_ONESHOT_BYTES=0, including a group of 3 (fold/unfold); either way
  results on random floats (where the summation order shows in the bits) are bitwise identical
  on every rank; stragg.recent_calls records every call, inline or not;
- a call that is one-shot-sized on some ranks and not on another (numel differs) raises a
  mismatch on every rank, promptly, instead of hanging until the timeout.
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
@pytest.mark.parametrize(
    "inline_bytes,oneshot_bytes", [("256KiB", "16KiB"), ("0", "16KiB"), ("256KiB", "0")]
)
def test_small_calls_exact_identical_and_recorded(
    ws: int, inline_bytes: str, oneshot_bytes: str
) -> None:
    env = {"STRAGG_INLINE_BYTES": inline_bytes, "STRAGG_ONESHOT_BYTES": oneshot_bytes}
    run = h.run_ranks(ws, small_calls_worker, env=env)
    values = run.values()
    digests = {v["random_digest"] for v in values}
    assert len(digests) == 1, f"ranks disagree bitwise on random floats: {digests}"
    for rank, v in enumerate(values):
        assert all(v["exact"]), f"rank {rank}: wrong results {v['exact']}"
        assert v["ok"] == [True] * 5, v
        assert v["bytes"] == [4000, 4, 28, 4000, 800_000], v
        # Tiny calls: the one-shot all_reduce on one host; without it recursive doubling (the
        # cost model's pick for latency-bound sizes). The 800 kB call is neither.
        tiny = "oneshot" if oneshot_bytes != "0" else "rd"
        assert v["plans"][:4] == [tiny] * 4, v["plans"]
        assert v["plans"][4] not in ("oneshot", "rd"), v["plans"]
        if inline_bytes != "0":
            assert v["small_completed_on_return"], f"rank {rank}: inline call not complete"


MISMATCH_TIMEOUT_S = 60.0


def straddling_worker(rank: int, ws: int) -> dict[str, Any]:
    """Rank 1's call is above STRAGG_ONESHOT_BYTES, the others' below: it runs a schedule while
    they wait in the one-shot exchange."""
    dist.all_reduce(torch.ones(8))  # warm: the group works
    t = torch.ones(5000 if rank == 1 else 100)
    first = h.capture(lambda: dist.all_reduce(t))
    return {"first": first}


def test_oneshot_size_mismatch_raises_promptly_on_every_rank() -> None:
    run = h.run_ranks(4, straddling_worker, pg_timeout_s=MISMATCH_TIMEOUT_S, timeout_s=120)
    for rank, v in enumerate(run.values()):
        first: h.Outcome = v["first"]
        assert not first.ok, f"rank {rank}: a mismatched call succeeded"
        assert "mismatch" in first.msg, f"rank {rank}: {first}"
        assert "rank 1" in first.msg and "schedule" in first.msg, f"rank {rank}: {first}"
        assert first.elapsed_s < MISMATCH_TIMEOUT_S / 2, f"rank {rank}: only the timeout: {first}"


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
