"""Stream semantics of ``dist.all_reduce`` on CUDA tensors on a stragg group.

What is checked (what ProcessGroupNCCL guarantees, and stragg's GPU path must keep):
- the collective is ordered after the work already enqueued on the *current* stream when it is
  called (a producer kernel that is still running when all_reduce is called must be seen);
- ``work.wait()`` makes the current stream wait for the result without blocking the host, so a
  consumer enqueued on that stream afterwards sees the reduced tensor;
- the synchronous form returns a tensor usable on the current stream, with exact sums.

Status: the GPU executor (kernels/) is not wired into csrc/backend yet, so CUDA all_reduce on a
stragg group is still delegated to the inner NCCL backend. The checks run anyway (they hold for
the delegated path too); the test is then reported as skipped with that reason, because stragg's
own GPU executor was not exercised. Skipped entirely when torch.cuda is unavailable (the CPU
torch wheel of CI).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("torch.cuda is not available (CPU torch build or no GPU)", allow_module_level=True)

# tests/ is on sys.path through tests/conftest.py.
import _harness as h
import torch.distributed as dist

pytestmark = [pytest.mark.needs_backend, pytest.mark.stragg_only]

NUMEL = 1 << 22


def _delegated_calls(group: Any = None) -> int | None:
    """CUDA all_reduces passed to the inner backend, or None if the CUDA backend is not stragg's."""
    from stragg import _C

    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    backend = pg._get_backend(torch.device("cuda"))
    if not isinstance(backend, _C.StraggBackend):
        return None
    return int(dict(backend.stats()).get("delegated_calls", 0))


def _stream_semantics(rank: int, world_size: int) -> dict[str, Any]:
    torch.cuda.set_device(rank)
    side = torch.cuda.Stream()
    expected = float(sum(r + 1 for r in range(world_size)))
    with torch.cuda.stream(side):
        # Producer still running when all_reduce is called: ~50 ms of spinning, then the value.
        t = torch.zeros(NUMEL, device="cuda")
        torch.cuda._sleep(50_000_000)
        t.add_(rank + 1)
        work = dist.all_reduce(t, async_op=True)
        work.wait()  # the side stream waits; the host does not
        consumer = t * 1.0  # enqueued on the side stream after wait()
        # Synchronous form on the same stream.
        u = torch.full((1000,), float(rank + 1), device="cuda")
        dist.all_reduce(u)
        u2 = u + 0.0
    torch.cuda.synchronize()
    return {
        "async_ok": bool(torch.all(consumer == expected).item()),
        "sync_ok": bool(torch.all(u2 == expected).item()),
        "delegated": _delegated_calls(),
    }


def test_cuda_allreduce_stream_semantics() -> None:
    world_size = min(2, torch.cuda.device_count())  # NCCL (delegated path): one GPU per rank
    values = h.run_ranks(world_size, _stream_semantics, timeout_s=300).values()
    for rank, v in enumerate(values):
        assert v["async_ok"], f"rank {rank}: consumer after work.wait() saw a stale tensor"
        assert v["sync_ok"], f"rank {rank}: synchronous all_reduce result wrong on its stream"
    delegated = [v["delegated"] for v in values]
    if any(d is None or d > 0 for d in delegated):
        pytest.skip(
            "stream semantics hold, but CUDA all_reduce was delegated to NCCL "
            f"(delegated_calls per rank: {delegated}): the GPU executor in kernels/ is not wired "
            "into csrc/backend yet"
        )
