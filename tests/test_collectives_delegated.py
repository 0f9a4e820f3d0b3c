"""Collectives other than all_reduce and barrier (tests/test_barrier.py) are delegated to Gloo:
on a "stragg" group they must behave exactly as on a plain gloo group of the same processes. Plus
a tiny DDP training run, which must end with the same parameters as the same training on gloo
(and as a single-process reference).

One spawn (3 ranks) runs everything; what plain gloo itself does not support is skipped.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Optional

import _harness as h
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

pytestmark = pytest.mark.needs_backend

WS = 3

Result = tuple[Any, Optional[str]]  # (comparable value, error against the analytic expectation)


def _tl(t: torch.Tensor) -> list[Any]:
    return t.tolist()


def op_broadcast(rank: int, ws: int, g: Any) -> Result:
    t = torch.arange(5, dtype=torch.float32) + 10 * rank
    dist.broadcast(t, src=1, group=g)
    want = (torch.arange(5, dtype=torch.float32) + 10).tolist()
    return _tl(t), None if _tl(t) == want else f"got {_tl(t)} want {want}"


def op_all_gather(rank: int, ws: int, g: Any) -> Result:
    out = [torch.zeros(3, dtype=torch.int64) for _ in range(ws)]
    dist.all_gather(out, torch.full((3,), rank, dtype=torch.int64), group=g)
    got = [_tl(t) for t in out]
    want = [[r] * 3 for r in range(ws)]
    return got, None if got == want else f"got {got} want {want}"


def op_all_gather_into_tensor(rank: int, ws: int, g: Any) -> Result:
    out = torch.zeros(2 * ws)
    dist.all_gather_into_tensor(out, torch.tensor([rank, 2.0 * rank]), group=g)
    want = [float(v) for r in range(ws) for v in (r, 2 * r)]
    return _tl(out), None if _tl(out) == want else f"got {_tl(out)} want {want}"


def op_reduce_scatter_tensor(rank: int, ws: int, g: Any) -> Result:
    out = torch.zeros(2)
    dist.reduce_scatter_tensor(out, torch.arange(2.0 * ws) * (rank + 1), group=g)
    total = sum(r + 1 for r in range(ws))
    want = [float(v * total) for v in range(2 * rank, 2 * rank + 2)]
    return _tl(out), None if _tl(out) == want else f"got {_tl(out)} want {want}"


def op_reduce_scatter(rank: int, ws: int, g: Any) -> Result:
    out = torch.zeros(2)
    dist.reduce_scatter(out, [torch.full((2,), float(rank + i)) for i in range(ws)], group=g)
    want = [float(sum(r + rank for r in range(ws)))] * 2
    return _tl(out), None if _tl(out) == want else f"got {_tl(out)} want {want}"


def op_send_recv(rank: int, ws: int, g: Any) -> Result:
    # rank 0 sends to every rank, then receives an answer from each (blocking calls)
    if rank == 0:
        for peer in range(1, ws):
            dist.send(torch.full((4,), float(peer)), dst=peer, group=g)
        got = []
        for peer in range(1, ws):
            t = torch.zeros(4)
            dist.recv(t, src=peer, group=g)
            got.append(_tl(t))
        want = [[peer * 100.0] * 4 for peer in range(1, ws)]
    else:
        t = torch.zeros(4)
        dist.recv(t, src=0, group=g)
        dist.send(t * 100, dst=0, group=g)
        got, want = [_tl(t)], [[float(rank)] * 4]
    return got, None if got == want else f"got {got} want {want}"


def op_isend_irecv(rank: int, ws: int, g: Any) -> Result:
    # a ring: everybody sends right and receives from the left at the same time
    right, left = (rank + 1) % ws, (rank - 1) % ws
    out = torch.zeros(3, dtype=torch.int32)
    works = [
        dist.isend(torch.full((3,), rank, dtype=torch.int32), dst=right, group=g),
        dist.irecv(out, src=left, group=g),
    ]
    for w in works:
        assert w is not None
        w.wait()
    want = [left] * 3
    return _tl(out), None if _tl(out) == want else f"got {_tl(out)} want {want}"


def op_all_to_all_single(rank: int, ws: int, g: Any) -> Result:
    out = torch.zeros(ws, dtype=torch.int64)
    dist.all_to_all_single(out, torch.tensor([rank * 10 + j for j in range(ws)]), group=g)
    want = [j * 10 + rank for j in range(ws)]
    return _tl(out), None if _tl(out) == want else f"got {_tl(out)} want {want}"


def op_all_to_all(rank: int, ws: int, g: Any) -> Result:
    outs = [torch.zeros(2) for _ in range(ws)]
    dist.all_to_all(outs, [torch.full((2,), float(rank * 10 + j)) for j in range(ws)], group=g)
    got = [_tl(t) for t in outs]
    want = [[float(j * 10 + rank)] * 2 for j in range(ws)]
    return got, None if got == want else f"got {got} want {want}"


def op_gather(rank: int, ws: int, g: Any) -> Result:
    dst = ws - 1
    bufs = [torch.zeros(2) for _ in range(ws)] if rank == dst else None
    dist.gather(torch.tensor([rank, rank + 0.5]), bufs, dst=dst, group=g)
    if rank != dst:
        return None, None
    got = [_tl(t) for t in bufs or []]
    want = [[float(r), r + 0.5] for r in range(ws)]
    return got, None if got == want else f"got {got} want {want}"


def op_scatter(rank: int, ws: int, g: Any) -> Result:
    src = 1
    out = torch.zeros(3)
    chunks = [torch.full((3,), float(r * 7)) for r in range(ws)] if rank == src else None
    dist.scatter(out, chunks, src=src, group=g)
    want = [float(rank * 7)] * 3
    return _tl(out), None if _tl(out) == want else f"got {_tl(out)} want {want}"


def op_reduce(rank: int, ws: int, g: Any) -> Result:
    t = torch.tensor([rank + 1.0, 2.0])
    dist.reduce(t, dst=0, op=dist.ReduceOp.PRODUCT, group=g)
    if rank != 0:
        return None, None  # the content on non-destination ranks is unspecified
    prod = 1.0
    for r in range(ws):
        prod *= r + 1
    want = [prod, 2.0**ws]
    return _tl(t), None if _tl(t) == want else f"got {_tl(t)} want {want}"


def op_all_gather_object(rank: int, ws: int, g: Any) -> Result:
    out: list[Any] = [None] * ws
    dist.all_gather_object(
        out, {"rank": rank, "name": f"r{rank}", "data": list(range(rank))}, group=g
    )
    want = [{"rank": r, "name": f"r{r}", "data": list(range(r))} for r in range(ws)]
    return out, None if out == want else f"got {out} want {want}"


def op_broadcast_object_list(rank: int, ws: int, g: Any) -> Result:
    objs: list[Any] = [("hello", 2), {"k": [1, 2, 3]}] if rank == 2 else [None, None]
    dist.broadcast_object_list(objs, src=2, group=g)
    want = [("hello", 2), {"k": [1, 2, 3]}]
    return objs, None if objs == want else f"got {objs} want {want}"


def op_gather_object(rank: int, ws: int, g: Any) -> Result:
    out: list[Any] | None = [None] * ws if rank == 0 else None
    dist.gather_object(f"from {rank}", out, dst=0, group=g)
    if rank != 0:
        return None, None
    want = [f"from {r}" for r in range(ws)]
    return out, None if out == want else f"got {out} want {want}"


OPS: dict[str, Callable[[int, int, Any], Result]] = {
    name[len("op_") :]: fn
    for name, fn in globals().items()
    if name.startswith("op_") and callable(fn)
}


# ----------------------------------------------------------------------------------------------
# DDP
# ----------------------------------------------------------------------------------------------

DDP_STEPS = 5
DDP_LR = 0.1


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2))


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(4, 6, generator=g), torch.randn(4, 2, generator=g)


def _train_ddp(rank: int, group: Any) -> list[torch.Tensor]:
    model = _model()
    ddp = DistributedDataParallel(model, process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=DDP_LR)
    for step in range(DDP_STEPS):
        x, y = _batch(rank, step)
        loss = ((ddp(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _train_reference(ws: int) -> list[torch.Tensor]:
    """Single process: average the gradients of every rank's batch by hand (float64)."""
    model = _model().double()
    opt = torch.optim.SGD(model.parameters(), lr=DDP_LR)
    for step in range(DDP_STEPS):
        grads = [torch.zeros_like(p) for p in model.parameters()]
        for r in range(ws):
            x, y = _batch(r, step)
            model.zero_grad()
            ((model(x.double()) - y.double()) ** 2).mean().backward()
            for acc, p in zip(grads, model.parameters()):
                assert p.grad is not None
                acc += p.grad / ws
        for p, gr in zip(model.parameters(), grads):
            p.grad = gr
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


# ----------------------------------------------------------------------------------------------
# Worker
# ----------------------------------------------------------------------------------------------


def delegated_worker(rank: int, ws: int) -> dict[str, Any]:
    stragg = h.is_stragg()
    gloo_group = dist.new_group(backend="gloo")
    out: dict[str, Any] = {"ops": {}}
    for name, fn in OPS.items():
        entry: dict[str, Any] = {}
        on_gloo = h.capture(functools.partial(fn, rank, ws, gloo_group))
        if not on_gloo.ok:
            entry["gloo_unsupported"] = str(on_gloo)
            out["ops"][name] = entry
            dist.barrier(group=gloo_group)
            continue
        before = h.backend_stats() if stragg else None
        on_default = h.capture(functools.partial(fn, rank, ws, None))
        after = h.backend_stats() if stragg else None
        entry["gloo"] = on_gloo.value
        entry["default"] = on_default.value if on_default.ok else None
        entry["default_error"] = None if on_default.ok else str(on_default)
        entry["stats"] = (before, after)
        out["ops"][name] = entry

    before = h.backend_stats() if stragg else None
    trained = _train_ddp(rank, None)
    after = h.backend_stats() if stragg else None
    out["ddp"] = {
        "default": trained,
        "gloo": _train_ddp(rank, gloo_group),
        "reference": _train_reference(ws),
        "initial": [p.detach().clone() for p in _model().parameters()],
        "digests": [h.digest(p) for p in trained],
        "stats": (before, after),
    }
    return out


@pytest.fixture(scope="module")
def run() -> h.RunResult:
    return h.run_ranks(WS, delegated_worker, timeout_s=180, check_leaks=False)


def test_every_rank_finished_cleanly(run: h.RunResult) -> None:
    assert len(run.values()) == WS
    run.assert_no_leaks()


@pytest.mark.parametrize("name", sorted(OPS))
def test_collective_behaves_like_gloo(run: h.RunResult, name: str) -> None:
    values = run.values()
    entries = [v["ops"][name] for v in values]
    unsupported = [e["gloo_unsupported"] for e in entries if "gloo_unsupported" in e]
    if unsupported:
        assert len(unsupported) == WS, f"{name}: gloo failed on some ranks only: {unsupported}"
        h.cannot(f"plain gloo, the reference, does not support {name} here: {unsupported[0]}")
    for rank, e in enumerate(entries):
        assert e["default_error"] is None, (
            f"rank {rank}: {name} on the {run.backend} group {e['default_error']}"
        )
        got, err = e["default"]
        assert err is None, f"rank {rank}: {name} on the {run.backend} group: {err}"
        assert got == e["gloo"][0], (
            f"rank {rank}: {name}: {run.backend} gave {got}, gloo gave {e['gloo'][0]}"
        )
        if run.backend == "stragg":
            before, after = e["stats"]
            assert after["delegated_calls"] > before["delegated_calls"], (
                f"rank {rank}: {name} did not go through the delegated path: {before} -> {after}"
            )
            assert after["allreduce_calls"] == before["allreduce_calls"], (
                f"rank {rank}: {name} ran stragg's all_reduce executor: {before} -> {after}"
            )


def _prefixed(prefix: str) -> Callable[[str], str]:
    return lambda message: f"{prefix}: {message}"


def test_ddp_matches_gloo_and_reference(run: h.RunResult) -> None:
    values = run.values()
    for rank, v in enumerate(values):
        d = v["ddp"]
        changed = any(not torch.equal(p, q) for p, q in zip(d["default"], d["initial"]))
        assert changed, f"rank {rank}: training did not change the parameters"
        for i, (p, q, ref) in enumerate(zip(d["default"], d["gloo"], d["reference"])):
            torch.testing.assert_close(
                p,
                q,
                rtol=1e-5,
                atol=1e-6,
                msg=_prefixed(f"rank {rank} param {i} vs gloo"),
            )
            torch.testing.assert_close(
                p.double(),
                ref,
                rtol=1e-4,
                atol=1e-5,
                msg=_prefixed(f"rank {rank} param {i} vs reference"),
            )
    digests = [v["ddp"]["digests"] for v in values]
    assert all(d == digests[0] for d in digests), "DDP parameters differ bitwise across ranks"


@pytest.mark.stragg_only
def test_ddp_gradients_used_stragg_allreduce(run: h.RunResult) -> None:
    for rank, v in enumerate(run.values()):
        before, after = v["ddp"]["stats"]
        assert after["allreduce_calls"] - before["allreduce_calls"] >= DDP_STEPS, (
            f"rank {rank}: DDP's gradient all_reduces did not run on stragg's executor: {before} -> {after}"
        )
        assert after["delegated_calls"] > before["delegated_calls"], (
            f"rank {rank}: DDP's parameter broadcast was not delegated: {before} -> {after}"
        )


# ----------------------------------------------------------------------------------------------
# STRAGG_TRANSPORT=gloo: all_reduce itself is delegated (transport "gloo")
# ----------------------------------------------------------------------------------------------


def gloo_transport_worker(rank: int, ws: int) -> dict[str, Any]:
    before = h.backend_stats()
    inputs = [h.make_input(r, ws, 1023, torch.float32, "SUM", 7) for r in range(ws)]
    t = inputs[rank].clone()
    dist.all_reduce(t)
    err = h.compare(t, h.reference(inputs, "SUM", ws), "SUM", ws)
    # a strided view on the delegated path must also be reduced in place, view semantics kept
    flat = [h.make_input(r, ws, 300, torch.int64, "MAX", 7) for r in range(ws)]
    buf = flat[rank].clone()
    view = buf[1::3]
    dist.all_reduce(view, op=dist.ReduceOp.MAX)
    view_err = h.compare(view, h.reference([f[1::3] for f in flat], "MAX", ws), "MAX", ws)
    untouched = torch.equal(buf[0::3], flat[rank][0::3]) and torch.equal(
        buf[2::3], flat[rank][2::3]
    )
    after = h.backend_stats()
    return {
        "before": before,
        "after": after,
        "err": err,
        "view_err": view_err,
        "untouched": untouched,
        "digest": h.digest(t),
    }


@pytest.mark.stragg_only
def test_transport_gloo_delegates_allreduce() -> None:
    run = h.run_ranks(2, gloo_transport_worker, env={"STRAGG_TRANSPORT": "gloo"}, timeout_s=120)
    values = run.values()
    for rank, v in enumerate(values):
        before, after = v["before"], v["after"]
        assert after["transport"] == "gloo", f"rank {rank}: {after}"
        assert v["err"] is None, f"rank {rank}: {v['err']}"
        assert v["view_err"] is None, f"rank {rank}: strided view on the gloo path: {v['view_err']}"
        assert v["untouched"], f"rank {rank}: elements outside the strided view were modified"
        assert after["allreduce_calls"] == before["allreduce_calls"], (
            f"rank {rank}: {before} -> {after}"
        )
        assert after["delegated_calls"] - before["delegated_calls"] == 2, (
            f"rank {rank}: {before} -> {after}"
        )
    assert values[0]["digest"] == values[1]["digest"]
