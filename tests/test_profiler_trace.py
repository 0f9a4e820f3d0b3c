"""torch.profiler traces of stragg's all_reduce (csrc/backend/call_trace.h): 4 ranks, rank 3 late
before every call, StragglAR for rank 3, under torch.profiler with record_shapes; each rank exports
a Chrome trace and the test reads it back.

- every call is one `stragg:all_reduce` event whose args carry its sequence number, numel, bytes,
  dtype, rank and the group's global ranks (also on a subgroup, and for a small call);
- its `stragg:run` range carries the plan (StragglAR for rank 3) and lies inside the call's range;
- on the ranks on time, `stragg:pre_arrival` then `stragg:post_arrival` nest inside `stragg:run`,
  one after the other; on the straggler only `stragg:post_arrival`;
- the event names torch's own checks count (`stragg:all_reduce`) appear once per call;
- a barrier is one `stragg:barrier` event with the group's args (rank, group, group_ranks).

Behaviour only: no duration is compared with anything.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections import defaultdict
from typing import Any

import _harness as h
import pytest
import torch
import torch.distributed as dist

pytestmark = [pytest.mark.needs_backend, pytest.mark.stragg_only]

NUMEL = 256 * 1024  # 1 MiB float32: above STRAGG_INLINE_BYTES, so it runs on the worker thread
SMALL = 16  # runs inline, on the calling thread
CALLS = 3
LATE = 3
DELAY_S = 0.02  # the late rank sleeps before each call
ENV = {
    "STRAGG_ALGO": "stragglar",
    "STRAGG_STRAGGLER": str(LATE),
    "STRAGG_PLAN_CHECK": "0",
}
EPS_US = 1.0  # the trace's timestamps are rounded to the microsecond's fraction


def _traced(rank: int, ws: int) -> dict[str, Any]:
    import stragg

    stragg.set_policy(algo="ring", straggler="none")  # the 2-rank subgroup has no rank 3
    try:
        sub = dist.new_group([2, 3])
    finally:
        stragg.reset_policy()
    big = torch.ones(NUMEL)
    dist.all_reduce(big)  # warm-up, outside the trace
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
    ) as prof:
        for _ in range(CALLS):
            t = torch.ones(NUMEL)
            if rank == LATE:
                time.sleep(DELAY_S)
            dist.all_reduce(t)
            assert torch.equal(t, torch.full((NUMEL,), float(ws))), f"rank {rank}: wrong sum"
        small = torch.ones(SMALL)
        dist.all_reduce(small)
        if rank in (2, 3):
            dist.all_reduce(torch.ones(SMALL), group=sub)
        dist.barrier()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    events = [
        {k: e.get(k) for k in ("name", "ts", "dur", "tid", "args")}
        for e in trace["traceEvents"]
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("stragg:")
    ]
    dist.destroy_process_group(sub)
    return {"events": events, "names": [e.name for e in prof.events()]}


def _inside(child: dict[str, Any], parent: dict[str, Any]) -> bool:
    return (child["ts"] >= parent["ts"] - EPS_US
            and child["ts"] + child["dur"] <= parent["ts"] + parent["dur"] + EPS_US)


def test_trace_carries_call_plan_and_arrival_phases() -> None:
    values = h.run_ranks(4, _traced, env=ENV, timeout_s=240).values()
    for rank, v in enumerate(values):
        by_name: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for e in v["events"]:
            by_name[e["name"]].append(e)
        calls = by_name["stragg:all_reduce"]
        extra = 1 if rank in (2, 3) else 0  # the subgroup's call
        assert len(calls) == CALLS + 1 + extra, f"rank {rank}: {calls}"
        assert v["names"].count("stragg:all_reduce") == CALLS + 1 + extra, f"rank {rank}"
        world = [c for c in calls if c["args"]["group_ranks"] == "[0, 1, 2, 3]"]
        assert len(world) == CALLS + 1, f"rank {rank}: {calls}"
        seqs = [c["args"]["seq"] for c in world]
        assert seqs == list(range(seqs[0], seqs[0] + CALLS + 1)), f"rank {rank}: {seqs}"
        for c in world:
            a = c["args"]
            numel = SMALL if a["seq"] == seqs[-1] else NUMEL
            assert a["numel"] == numel and a["bytes"] == 4 * numel, f"rank {rank}: {a}"
            assert a["dtype"] == "float32" and a["rank"] == rank, f"rank {rank}: {a}"
        if extra:
            (s,) = [c for c in calls if c["args"]["group_ranks"] == "[2, 3]"]
            assert s["args"]["rank"] == rank - 2 and s["args"]["seq"] == 0, f"rank {rank}: {s}"
        (barrier,) = by_name["stragg:barrier"]
        b = barrier["args"]
        assert b["rank"] == rank and b["group_ranks"] == "[0, 1, 2, 3]", f"rank {rank}: {b}"
        assert b["group"] == world[0]["args"]["group"], f"rank {rank}: {b}"
        assert b["group_desc"] == world[0]["args"]["group_desc"], f"rank {rank}: {b}"

        runs = {(r["args"]["group"], r["args"]["seq"]): r for r in by_name["stragg:run"]}
        for c in world:
            seq = c["args"]["seq"]
            run = runs.get((c["args"]["group"], seq))
            assert run is not None, f"rank {rank}: no stragg:run for call #{seq}"
            assert run["args"]["algorithm"] == "stragglar", f"rank {rank}: {run}"
            assert run["args"]["plan"].startswith("stragglar"), f"rank {rank}: {run}"
            assert run["args"]["straggler"] == LATE, f"rank {rank}: {run}"
            assert _inside(run, c), f"rank {rank}: call #{seq}: run {run} outside {c}"

            pre = [e for e in by_name["stragg:pre_arrival"] if e["args"]["seq"] == seq]
            post = [e for e in by_name["stragg:post_arrival"] if e["args"]["seq"] == seq]
            assert len(post) == 1, f"rank {rank}: call #{seq}: {post}"
            assert post[0]["args"]["straggler"] == LATE
            assert post[0]["tid"] == run["tid"] and _inside(post[0], run), f"rank {rank}: #{seq}"
            if rank == LATE:
                assert not pre, f"rank {rank} (the straggler): pre-arrival steps {pre}"
                continue
            assert len(pre) == 1, f"rank {rank}: call #{seq}: {pre}"
            assert pre[0]["tid"] == run["tid"] and _inside(pre[0], run), f"rank {rank}: #{seq}"
            assert pre[0]["ts"] + pre[0]["dur"] <= post[0]["ts"] + EPS_US, (
                f"rank {rank}: call #{seq}: pre-arrival {pre[0]} overlaps post-arrival {post[0]}")
