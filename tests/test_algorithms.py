"""all_reduce with every schedule from the library (STRAGG_ALGO) and a configured straggler.

Each algorithm runs through dist.all_reduce: results must be exact (integer-valued data, so any
summation order is exact), bitwise identical on every rank, and run on stragg's executor.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import _harness as h
import pytest
import torch
import torch.distributed as dist

pytestmark = [pytest.mark.needs_backend, pytest.mark.stragg_only]

SIZES = (1, 7, 1023, (3 << 20) // 4 + 5)  # the last needs segmentation for staged schedules


def _check_all_sizes(rank: int, ws: int, sleep_rank: int) -> dict[str, Any]:
    digests = []
    for numel in SIZES:
        base = torch.arange(numel, dtype=torch.float32) % 13
        t = base + rank
        if rank == sleep_rank:
            time.sleep(0.2)  # arrive last, as a straggler would
        dist.all_reduce(t)
        expected = base * ws + ws * (ws - 1) / 2
        assert torch.equal(t, expected), f"rank {rank}: wrong result for numel={numel}"
        digests.append(h.digest(t))
        t64 = torch.arange(numel, dtype=torch.float64) * (rank + 1)
        dist.all_reduce(t64, op=dist.ReduceOp.MAX)
        assert torch.equal(t64, torch.arange(numel, dtype=torch.float64) * ws)
        digests.append(h.digest(t64))
        # Signed zeros: min(-0, +0) must come out the same on every rank, whichever side of an
        # exchange reduces it.
        z = torch.zeros(numel) * (-1.0 if rank % 2 else 1.0)
        dist.all_reduce(z, op=dist.ReduceOp.MIN)
        assert torch.equal(z, torch.zeros(numel))
        digests.append(h.digest(z))
    stats = h.backend_stats()
    return {"digests": digests, "algorithm": stats["algorithm"], "calls": stats["allreduce_calls"]}


@pytest.mark.parametrize(
    "algo", ["ring", "rhd", "direct", "bcast", "stragglar", "optcc", "rd", "stragglar_direct"]
)
@pytest.mark.parametrize("ws", [3, 4])
def test_every_algorithm_is_exact_and_identical(algo: str, ws: int) -> None:
    res = h.run_ranks(ws, _check_all_sizes, 1, env={"STRAGG_ALGO": algo, "STRAGG_STRAGGLER": "1"})
    assert all(r.ok for r in res), res.describe()
    values = res.values()
    assert all(v["algorithm"] == algo for v in values), values
    assert all(v["calls"] == 3 * len(SIZES) for v in values), values
    assert all(v["digests"] == values[0]["digests"] for v in values), "ranks differ bitwise"


def test_auto_uses_stragglar_with_a_configured_straggler() -> None:
    res = h.run_ranks(5, _check_all_sizes, 4, env={"STRAGG_STRAGGLER": "4"})
    assert all(r.ok for r in res), res.describe()
    assert {v["algorithm"] for v in res.values()} == {"stragglar"}
    assert all(v["digests"] == res.values()[0]["digests"] for v in res.values())


def _init_with_algo(rank: int, ws: int) -> None:
    os.environ["STRAGG_ALGO"] = "ring" if rank == 0 else "stragglar"
    h.init_process_group(rank, ws)


def test_ranks_disagreeing_on_the_algorithm_fail_at_init() -> None:
    res = h.run_ranks(2, _init_with_algo, init=False, destroy=False, pg_timeout_s=20)
    for r in res:
        assert r.raised, res.describe()
        assert "STRAGG_ALGO" in r.describe() and "mismatch" in r.describe(), res.describe()


def _init_only(rank: int, ws: int) -> None:
    h.init_process_group(rank, ws)


def test_unknown_algorithm_is_rejected() -> None:
    res = h.run_ranks(
        2, _init_only, init=False, destroy=False, env={"STRAGG_ALGO": "fastest"}, pg_timeout_s=20
    )
    for r in res:
        assert r.raised and "STRAGG_ALGO" in r.describe(), res.describe()


def _dynamic(rank: int, ws: int, late_ranks: list[int]) -> dict[str, Any]:
    digests = []
    for it, late in enumerate(late_ranks):
        for numel in (7, (3 << 20) // 4 + 5):
            base = torch.arange(numel, dtype=torch.float32) % 13
            t = base + rank
            if rank == late:
                time.sleep(0.15)
            dist.all_reduce(t)
            assert torch.equal(t, base * ws + ws * (ws - 1) / 2), f"rank {rank} iteration {it}"
            digests.append(h.digest(t))
        stats = h.backend_stats()
        assert stats["last_straggler"] == late, (it, late, stats)
    import stragg

    return {"digests": digests, "stats": h.backend_stats(), "calls": stragg.recent_calls()}


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_dynamic_straggler_follows_whoever_is_late(transport: str) -> None:
    # The late rank is drawn at random per iteration (seeded, so a failure can be replayed).
    late_ranks = [2, *random.Random(20261121).choices(range(4), k=4)]
    res = h.run_ranks(
        4,
        _dynamic,
        late_ranks,
        env={
            "STRAGG_STRAGGLER": "dynamic",
            "STRAGG_DYNAMIC_WINDOW_US": "2000",
            "STRAGG_TRANSPORT": transport,
        },
    )
    assert all(r.ok for r in res), res.describe()
    values = res.values()
    assert all(v["digests"] == values[0]["digests"] for v in values), "ranks differ bitwise"
    for rank, v in enumerate(values):
        assert v["stats"]["algorithm"] == "auto" and v["stats"]["transport"] == transport
        assert v["stats"]["dynamic_straggler_calls"] == 2 * len(late_ranks)
        calls = v["calls"]
        assert [c["seq"] for c in calls] == list(range(2 * len(late_ranks)))
        assert [c["straggler"] for c in calls] == [r for r in late_ranks for _ in range(2)]
        assert all(c["ok"] and c["algorithm"] == "stragglar" for c in calls)
        for c in calls:
            assert 0.0 <= c["wait_s"] <= c["run_s"] and c["pre_arrival_s"] <= c["run_s"]
            # Early ranks do the pre-arrival reduce-scatter; the straggler has none.
            assert (c["pre_arrival_s"] > 0) == (c["straggler"] != rank), (rank, c)


def _dynamic_auto_window(rank: int, ws: int) -> dict[str, Any]:
    import stragg

    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    windows = []
    for numel in (1024, 1 << 20):
        for it in range(3):
            t = torch.full((numel,), float(rank))
            if rank == it % ws:
                time.sleep(0.05)
            dist.all_reduce(t)
            assert torch.equal(t, torch.full((numel,), float(ws * (ws - 1) / 2)))
        windows.append(backend.dynamic_window_s(numel * 4))
    return {"calls": stragg.recent_calls(), "windows": windows}


def test_dynamic_window_from_the_cost_model() -> None:
    # STRAGG_DYNAMIC_WINDOW_US unset: the wait-or-proceed window is StragglAR's critical delay
    # for the call's size (break-even), so it grows with the message.
    # The profiler off: its first exchange (after call 4) would replace the default cost model
    # with the calls' own rate halfway through.
    res = h.run_ranks(3, _dynamic_auto_window,
                      env={"STRAGG_STRAGGLER": "dynamic", "STRAGG_PROFILE": "0"})
    assert all(r.ok for r in res), res.describe()
    for v in res.values():
        small, large = v["windows"]
        assert 50e-6 <= small < large, v["windows"]
        calls = v["calls"]
        assert [c["window_s"] for c in calls] == pytest.approx([small] * 3 + [large] * 3, rel=1e-6)
        assert all(c["straggler"] == i % 3 for i, c in enumerate(calls)), calls


def test_dynamic_straggler_needs_stragglar() -> None:
    res = h.run_ranks(
        2,
        _init_only,
        init=False,
        destroy=False,
        env={"STRAGG_STRAGGLER": "dynamic", "STRAGG_ALGO": "ring"},
        pg_timeout_s=20,
    )
    for r in res:
        assert r.raised and "dynamic" in r.describe(), res.describe()


def test_stragglar_when_another_rank_is_late() -> None:
    # Configured straggler 3, but rank 1 arrives last: still exact, just slower.
    res = h.run_ranks(4, _check_all_sizes, 1, env={"STRAGG_ALGO": "stragglar", "STRAGG_STRAGGLER": "3"})
    assert all(r.ok for r in res), res.describe()
    values = res.values()
    assert all(v["algorithm"] == "stragglar" for v in values)
    assert all(v["digests"] == values[0]["digests"] for v in values), "ranks differ bitwise"


def _async_burst(rank: int, ws: int, calls: int) -> dict[str, Any]:
    rng = random.Random(1000 + rank)
    works, tensors, expected = [], [], []
    for i in range(calls):
        numel = (1 << 18) + 17 * i if i % 3 else 5 + i
        base = (torch.arange(numel, dtype=torch.float32) + i) % 11
        t = base * (rank + 1)
        tensors.append(t)
        expected.append(base * (ws * (ws + 1) // 2))
        if rng.random() < 0.4:
            time.sleep(rng.uniform(0.0, 0.03))  # a different rank is late for different calls
        works.append(dist.all_reduce(t, async_op=True))
    for w in works:
        w.wait()
    for i, (t, e) in enumerate(zip(tensors, expected)):
        assert torch.equal(t, e), f"rank {rank}: call {i} wrong"
    import stragg

    return {"digests": [h.digest(t) for t in tensors], "calls": stragg.recent_calls()}


@pytest.mark.parametrize("straggler", ["2", "dynamic"])
def test_back_to_back_async_calls_interleaved_with_delays(straggler: str) -> None:
    res = h.run_ranks(4, _async_burst, 24, env={"STRAGG_STRAGGLER": straggler})
    assert all(r.ok for r in res), res.describe()
    values = res.values()
    assert all(v["digests"] == values[0]["digests"] for v in values), "ranks differ bitwise"
    for v in values:
        assert [c["seq"] for c in v["calls"]] == list(range(24))
        assert all(c["ok"] for c in v["calls"])
    # Every rank ran the same algorithm with the same straggler for every call.
    plans = [[(c["algorithm"], c["straggler"]) for c in v["calls"]] for v in values]
    assert all(p == plans[0] for p in plans), plans


ALGOS = ("ring", "rhd", "direct", "bcast", "stragglar", "optcc", "stragglar_direct")


def _every_algorithm_one_spawn(rank: int, ws: int) -> dict[str, Any]:
    """One group per algorithm (stragg.set_policy before each new_group), same checks as above
    with a real delay on the configured straggler (the last rank)."""
    import stragg

    out: dict[str, Any] = {}
    for algo in ALGOS:
        stragg.set_policy(algo=algo, straggler=ws - 1)
        group = dist.new_group(backend="stragg")
        stragg.reset_policy()
        digests = []
        for numel in (1, 1023, (3 << 20) // 4 + 5):
            base = torch.arange(numel, dtype=torch.float32) % 13
            t = base + rank
            if rank == ws - 1 and numel > 1:
                time.sleep(0.05)
            dist.all_reduce(t, group=group)
            assert torch.equal(t, base * ws + ws * (ws - 1) / 2), f"rank {rank} {algo} {numel}"
            digests.append(h.digest(t))
            z = torch.zeros(numel) * (-1.0 if rank % 2 else 1.0)
            dist.all_reduce(z, op=dist.ReduceOp.MIN, group=group)
            assert torch.equal(z, torch.zeros(numel))
            digests.append(h.digest(z))
        st = h.backend_stats(group)
        calls = stragg.recent_calls(group)
        out[algo] = {
            "digests": digests,
            "algorithm": st["algorithm"],
            "ran": sorted({c["algorithm"] for c in calls}),
        }
        dist.destroy_process_group(group)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("ws", [2, 5, 6, 8])
def test_every_algorithm_at_more_world_sizes(ws: int) -> None:
    # n in {2, 5, 6, 8} (3 and 4 above): odd, even non-power-of-2 and powers of 2. At n = 2 the
    # straggler-aware algorithms fall back to Ring (StragglAR needs 3 ranks) or run as built.
    res = h.run_ranks(ws, _every_algorithm_one_spawn, timeout_s=300)
    assert all(r.ok for r in res), res.describe()
    values = res.values()
    for algo in ALGOS:
        per_rank = [v[algo] for v in values]
        assert all(p["digests"] == per_rank[0]["digests"] for p in per_rank), (algo, "differ")
        ran = per_rank[0]["ran"]
        if ws == 2 and algo == "stragglar":
            assert ran == ["ring"], ran
        else:
            assert ran == [algo], (algo, ran)
