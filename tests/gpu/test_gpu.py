"""``dist.all_reduce`` on CUDA tensors on a stragg group (run on a GPU machine).

With stragg._C built with ``STRAGG_BACKEND_CUDA`` (a CUDA torch and ``STRAGG_CUDA=on``, see
tests/gpu/README.md), CUDA all_reduce runs on stragg's GPU executor. Every rank uses GPU 0, so the
p2p layer is CUDA IPC (several processes per GPU), on 2 and 4 ranks:

- every algorithm (ring, rhd, direct, bcast, stragglar, optcc): exact results (integer-valued
  data), results within tolerance for random floats, bitwise identical on every rank, large
  tensors that take many staging pieces;
- every dtype x op (as on the CPU path, tests/test_allreduce_semantics.py), complex, PREMUL_SUM,
  non-contiguous tensors (written back in place, the rest untouched), zero elements;
- stream semantics (those of ProcessGroupNCCL): the collective is ordered after work already on
  the caller's current stream (a producer still running at call time); ``work.wait()`` returns
  without waiting for the GPU and orders the current stream, so work queued after it sees the
  result with no ``torch.cuda.synchronize()``; an all_reduce issued on a side stream; a tensor
  freed before the collective finished is not handed to another allocation (recordStream);
- ``async_op`` + ``get_future()`` (value, ``then`` chaining, issue-order completion of several
  outstanding calls), ``is_completed()`` polling;
- stats: the calls ran on stragg's executor (``cuda_allreduce_calls``), none was delegated;
- a rank that does not call makes the other raise ``DistBackendError`` naming rank and call
  within the timeout (no hang, no abort of the process).

``STRAGG_CUDA_ALLREDUCE=nccl`` (or a build without the GPU path) keeps delegating to NCCL: the
stream-semantics check then runs on the delegated path (one GPU per rank).

Skipped entirely when torch.cuda is unavailable (the CPU torch wheel of CI); the GPU-path tests are
skipped, with the reason, when stragg._C was built without STRAGG_BACKEND_CUDA.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("torch.cuda is not available (CPU torch build or no GPU)", allow_module_level=True)

# tests/ is on sys.path through tests/conftest.py.
import _harness as h
import torch.distributed as dist

pytestmark = [pytest.mark.needs_backend, pytest.mark.stragg_only]

SEED = 20250301
NUMEL = 1 << 22
BIG = (1 << 20) + 3  # float32: 4 MiB + 12 B, several 1 MiB CUDA-IPC staging slots
ALGOS = ("ring", "rhd", "direct", "bcast", "stragglar", "optcc", "stragglar_direct")
FLOAT_OPS = ("SUM", "AVG", "MIN", "MAX", "PRODUCT", "PREMUL_SUM")
INT_OPS = ("SUM", "AVG", "MIN", "MAX", "PRODUCT", "BAND", "BOR", "BXOR")
BOOL_OPS = ("SUM", "MIN", "MAX", "PRODUCT", "BAND", "BOR", "BXOR")


def _gpu_path_compiled() -> bool:
    try:
        from stragg import _C
    except Exception:  # noqa: BLE001  # pragma: no cover - depends on the build
        return False
    return bool(getattr(_C, "cuda_allreduce_compiled", False))


needs_gpu_path = pytest.mark.skipif(
    not _gpu_path_compiled(),
    reason="stragg._C was built without STRAGG_BACKEND_CUDA (CUDA all_reduce is delegated to "
    "NCCL): build it against a CUDA torch with STRAGG_CUDA=on, see tests/gpu/README.md",
)


# ----------------------------------------------------------------------------------------------
# Worker side (every rank on GPU 0)
# ----------------------------------------------------------------------------------------------


def _op(op: str, dtype: torch.dtype) -> Any:
    if op == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(h.PREMUL_FACTOR[dtype])
    return getattr(dist.ReduceOp, op)


def _ops_for(dtype: torch.dtype) -> tuple[str, ...]:
    if dtype == torch.bool:
        return BOOL_OPS
    if dtype in h.INT_DTYPES:
        return INT_OPS
    return FLOAT_OPS


def _int_valued(rank: int, n: int) -> torch.Tensor:
    g = torch.Generator()
    g.manual_seed(SEED + 7919 * rank + n)
    return torch.randint(-1000, 1001, (n,), generator=g).to(torch.float32)


def _check(t: torch.Tensor, inputs: list[torch.Tensor], op: str, ws: int) -> dict[str, Any]:
    cpu = t.cpu()  # on the current stream: ordered after work.wait()
    return {"err": h.compare(cpu, h.reference(inputs, op, ws), op, ws), "digest": h.digest(cpu)}


def _one(rank: int, ws: int, inputs: list[torch.Tensor], op: str, group: Any = None) -> Any:
    t = inputs[rank].cuda()
    o = h.capture(lambda: dist.all_reduce(t, op=_op(op, inputs[0].dtype), group=group))
    if not o.ok:
        return {"err": f"all_reduce raised: {o}", "digest": None}
    return _check(t, inputs, op, ws)


def _stats(group: Any = None) -> dict[str, Any]:
    return h.backend_stats(group)


def _algorithms(rank: int, ws: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for algo in ALGOS:
        # Read when a group is created (stragg._config); equal on every rank.
        os.environ["STRAGG_ALGO"] = algo
        os.environ["STRAGG_STRAGGLER"] = str(ws - 1) if algo in ("stragglar", "optcc") else "none"
        group = dist.new_group(backend="stragg")
        res: dict[str, Any] = {}
        exact = [_int_valued(r, 4099) for r in range(ws)]
        res["f32_int_valued"] = _one(rank, ws, exact, "SUM", group)
        big = [_int_valued(r, BIG) for r in range(ws)]
        res["f32_int_valued_big"] = _one(rank, ws, big, "SUM", group)
        for name, dtype, op, n in (
            ("f32_randn", torch.float32, "SUM", 1023),
            ("f32_randn_big", torch.float32, "SUM", BIG),
            ("int64", torch.int64, "SUM", 1023),
            ("bf16", torch.bfloat16, "SUM", 1023),
            ("f16_avg", torch.float16, "AVG", 777),
            ("f64_max", torch.float64, "MAX", 5),
        ):
            inputs = [h.make_input(r, ws, n, dtype, op, SEED) for r in range(ws)]
            res[name] = _one(rank, ws, inputs, op, group)
        res["stats"] = _stats(group)
        dist.destroy_process_group(group)
        out[algo] = res
    os.environ.pop("STRAGG_ALGO", None)
    os.environ.pop("STRAGG_STRAGGLER", None)
    return out


def _matrix(rank: int, ws: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dtype in h.ALL_DTYPES:
        for op in _ops_for(dtype):
            for n in (1, 7, 1023):
                inputs = [h.make_input(r, ws, n, dtype, op, SEED) for r in range(ws)]
                out[f"{h.dtype_name(dtype)}|{op}|{n}"] = _one(rank, ws, inputs, op)
    # complex (SUM over the real view; AVG divides both parts)
    n = 1023
    cin = [
        torch.complex(
            h.make_input(r, ws, n, torch.float32, "SUM", SEED),
            h.make_input(r, ws, n + 1, torch.float32, "SUM", SEED)[:n],
        )
        for r in range(ws)
    ]
    out["complex64|SUM"] = _one(rank, ws, cin, "SUM")
    t = cin[rank].cuda()
    o = h.capture(lambda: dist.all_reduce(t, op=dist.ReduceOp.AVG))
    want = torch.stack([c.to(torch.complex128) for c in cin]).sum(0) / ws
    got = t.cpu().to(torch.complex128)
    out["complex64|AVG"] = {
        "err": None if o.ok and torch.allclose(got, want, rtol=1e-5, atol=1e-5) else f"{o}",
        "digest": h.digest(t.cpu()),
    }
    # non-contiguous: a transposed matrix, and every third element (the rest stays untouched)
    bases = [
        h.make_input(r, ws, 33 * 31, torch.float32, "SUM", SEED).reshape(33, 31) for r in range(ws)
    ]
    base = bases[rank].cuda()
    view = base.t()
    o = h.capture(lambda: dist.all_reduce(view))
    ref = h.reference([b.t() for b in bases], "SUM", ws)
    out["transposed"] = {
        "err": h.compare(view.cpu(), ref, "SUM", ws) if o.ok else str(o),
        "digest": h.digest(view.cpu()),
    }
    flat = [h.make_input(r, ws, 3000, torch.int64, "MAX", SEED) for r in range(ws)]
    buf = flat[rank].cuda()
    view2 = buf[1::3]
    o = h.capture(lambda: dist.all_reduce(view2, op=dist.ReduceOp.MAX))
    cpu = buf.cpu()
    err = h.compare(cpu[1::3], h.reference([f[1::3] for f in flat], "MAX", ws), "MAX", ws)
    untouched = torch.equal(cpu[0::3], flat[rank][0::3]) and torch.equal(
        cpu[2::3], flat[rank][2::3]
    )
    out["strided"] = {
        "err": (err if o.ok else str(o)) or (None if untouched else "other elements changed"),
        "digest": h.digest(cpu[1::3]),
    }
    # zero elements, then the group still works
    z = torch.empty(0, device="cuda")
    o = h.capture(lambda: dist.all_reduce(z))
    after = [torch.full((5,), float(r + 1)) for r in range(ws)]
    res = _one(rank, ws, after, "SUM")
    out["zero_then_more"] = res if o.ok else {"err": f"zero elements: {o}", "digest": None}
    return out


def _sleep_cycles_per_s() -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)  # warm up
    start.record()
    torch.cuda._sleep(100_000_000)
    end.record()
    end.synchronize()
    return 100_000_000 / (start.elapsed_time(end) / 1000.0)


def _streams(rank: int, ws: int) -> dict[str, Any]:
    expected = float(sum(r + 1 for r in range(ws)))
    cycles_per_s = _sleep_cycles_per_s()
    out: dict[str, Any] = {}
    # Warm-up: the first CUDA all_reduce sets the p2p layer up (collective, blocking).
    w = torch.ones(16, device="cuda")
    dist.all_reduce(w)
    torch.cuda.synchronize()
    dist.barrier()  # stragg's (CPU) barrier: the ranks' hosts start the next part together

    # (a) The producer is still running on the current stream for ~1 s when all_reduce is called;
    # wait() returns long before (it orders the stream, it does not block on the GPU).
    t = torch.zeros(NUMEL, device="cuda")
    torch.cuda._sleep(int(1.0 * cycles_per_s))
    t.add_(rank + 1)
    t0 = time.monotonic()
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    host_s = time.monotonic() - t0
    completed_right_after = work.is_completed()
    consumer = t * 1.0  # queued after wait() on the current stream
    out["current_stream"] = {
        "ok": bool((consumer == expected).all().item()),  # .item(): syncs this stream only
        "host_s": host_s,
        "completed_right_after_wait": completed_right_after,
    }

    # (b) Issued on a side stream: producer, all_reduce (async and sync), consumer all there.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        u = torch.zeros(NUMEL, device="cuda")
        torch.cuda._sleep(int(0.2 * cycles_per_s))
        u.add_(rank + 1)
        work = dist.all_reduce(u, async_op=True)
        work.wait()
        consumer_side = u * 1.0
        v = torch.full((1000,), float(rank + 1), device="cuda")
        dist.all_reduce(v)
        v2 = v + 0.0
        side_ok = bool((consumer_side == expected).all().item())
        sync_ok = bool((v2 == expected).all().item())
    out["side_stream"] = {"ok": side_ok, "sync_ok": sync_ok}

    # (c) Allocator safety: the tensor is freed before the collective finished; a new allocation
    # on the caller's stream must not get its block while the executor still writes it.
    x = torch.zeros(NUMEL, device="cuda")
    torch.cuda._sleep(int(0.3 * cycles_per_s))
    x.add_(rank + 1)
    work = dist.all_reduce(x, async_op=True)
    del x
    y = torch.full((NUMEL,), 7.0, device="cuda")
    work.wait()
    y_after = y * 1.0
    out["record_stream"] = {"ok": bool((y_after == 7.0).all().item())}

    # (d) get_future(): the value, then-chaining, completion of several calls in issue order.
    z = torch.full((1000,), float(rank + 1), device="cuda")
    fut = dist.all_reduce(z, async_op=True).get_future()
    value = fut.wait()
    future_ok = (
        isinstance(value, list)
        and len(value) == 1
        and value[0].data_ptr() == z.data_ptr()
        and bool((value[0] == expected).all().item())
    )
    z2 = torch.full((1000,), float(rank + 1), device="cuda")
    chained = (
        dist.all_reduce(z2, async_op=True)
        .get_future()
        .then(lambda f: float(f.value()[0].double().sum().item()))
    )
    chained_value = chained.wait()
    order: list[int] = []
    tensors, futs = [], []
    for i in range(8):
        tt = torch.full((4096 * (i + 1),), float((rank + 1) * (i + 1)), device="cuda")
        tensors.append(tt)
        futs.append(
            dist.all_reduce(tt, async_op=True).get_future().then(lambda f, i=i: order.append(i))
        )
    for f in reversed(futs):
        f.wait()
    outstanding_ok = all(
        bool((tt == expected * (i + 1)).all().item()) for i, tt in enumerate(tensors)
    )
    out["future"] = {
        "ok": future_ok,
        "chained": chained_value,
        "chained_want": expected * 1000,
        "order": order,
        "outstanding_ok": outstanding_ok,
    }

    # (e) is_completed() polling, then the tensor read on another stream.
    q = torch.full((1000,), float(rank + 1), device="cuda")
    work = dist.all_reduce(q, async_op=True)
    deadline = time.monotonic() + 60
    while not work.is_completed() and time.monotonic() < deadline:
        time.sleep(0.001)
    polled = work.is_completed()
    with torch.cuda.stream(torch.cuda.Stream()):
        polled_ok = bool((q == expected).all().item())
    out["polling"] = {"completed": polled, "ok": polled_ok}
    return out


@functools.cache
def _run(ws: int) -> list[dict[str, Any]]:
    return h.run_ranks(
        ws,
        _gpu_worker,
        timeout_s=900,
        pg_timeout_s=120,
        env={"STRAGG_CUDA_ALLREDUCE": "stragg", "STRAGG_PROFILE": "0"},
    ).values()


def _gpu_worker(rank: int, ws: int) -> dict[str, Any]:
    torch.cuda.set_device(0)  # every rank on GPU 0: CUDA IPC between processes
    res: dict[str, Any] = {}
    for name, fn in (("algorithms", _algorithms), ("matrix", _matrix)):
        o = h.capture(functools.partial(fn, rank, ws))
        res[name] = o.value if o.ok else {"__exception__": str(o)}
    if ws == 2:
        o = h.capture(functools.partial(_streams, rank, ws))
        res["streams"] = o.value if o.ok else {"__exception__": str(o)}
    res["stats"] = _stats()
    return res


def _section(values: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    out = []
    for rank, v in enumerate(values):
        sec = v[name]
        assert "__exception__" not in sec, f"rank {rank}: {name}: {sec['__exception__']}"
        out.append(sec)
    return out


def _assert_cases(per_rank: list[dict[str, Any]], label: str) -> None:
    problems = []
    for key in per_rank[0]:
        if key == "stats":
            continue
        for rank, sec in enumerate(per_rank):
            if sec[key]["err"]:
                problems.append(f"{label} {key} rank {rank}: {sec[key]['err']}")
        digests = {sec[key]["digest"] for sec in per_rank}
        if len(digests) != 1:
            problems.append(f"{label} {key}: results differ between ranks")
    assert not problems, "\n".join(problems[:30])


# ----------------------------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------------------------


@needs_gpu_path
@pytest.mark.parametrize("ws", [2, 4])
def test_every_algorithm_exact_and_identical(ws: int) -> None:
    per_rank = _section(_run(ws), "algorithms")
    for algo in ALGOS:
        _assert_cases([r[algo] for r in per_rank], f"{algo} (n={ws})")
        for rank, r in enumerate(per_rank):
            st = r[algo]["stats"]
            assert st.get("cuda_allreduce_calls", 0) >= 8, (algo, rank, st)
            assert st.get("delegated_calls", 0) == 0, (algo, rank, st)
            assert st.get("cuda_p2p_ipc") == 1, (algo, rank, st)


@needs_gpu_path
@pytest.mark.parametrize("ws", [2, 4])
def test_every_dtype_and_op(ws: int) -> None:
    _assert_cases(_section(_run(ws), "matrix"), f"n={ws}")
    for rank, v in enumerate(_run(ws)):
        assert v["stats"].get("delegated_calls", 0) == 0, (rank, v["stats"])
        assert v["stats"].get("cuda_failed_calls", 0) == 0, (rank, v["stats"])


@needs_gpu_path
def test_stream_semantics() -> None:
    for rank, s in enumerate(_section(_run(2), "streams")):
        cur = s["current_stream"]
        assert cur["ok"], f"rank {rank}: work queued after wait() saw a stale tensor"
        assert cur["host_s"] < 0.5, f"rank {rank}: wait() blocked the host {cur['host_s']:.2f} s"
        assert not cur["completed_right_after_wait"], (
            f"rank {rank}: is_completed() was true while the producer was still running"
        )
        assert s["side_stream"]["ok"], f"rank {rank}: side stream: stale result after wait()"
        assert s["side_stream"]["sync_ok"], f"rank {rank}: side stream: synchronous form wrong"
        assert s["record_stream"]["ok"], (
            f"rank {rank}: a tensor freed before completion had its block reused (recordStream)"
        )


@needs_gpu_path
def test_async_op_and_future() -> None:
    for rank, s in enumerate(_section(_run(2), "streams")):
        f = s["future"]
        assert f["ok"], f"rank {rank}: get_future().wait() value wrong"
        assert f["chained"] == f["chained_want"], f"rank {rank}: then() saw {f['chained']}"
        assert f["order"] == list(range(8)), f"rank {rank}: completion order {f['order']}"
        assert f["outstanding_ok"], f"rank {rank}: outstanding calls wrong"
        assert s["polling"]["completed"] and s["polling"]["ok"], f"rank {rank}: polling"


def _late_rank_worker(rank: int, ws: int) -> dict[str, Any]:
    torch.cuda.set_device(0)
    w = torch.ones(1024, device="cuda")
    dist.all_reduce(w)  # both ranks: sets the p2p layer up
    torch.cuda.synchronize()
    if rank == 1:
        h.wait_posted("rank0_done", [0], timeout_s=120)  # never calls the second all_reduce
        return {"ok": True}
    t = torch.ones(1 << 20, device="cuda")
    o = h.capture(lambda: dist.all_reduce(t))
    h.post("rank0_done", rank)
    later = h.capture(lambda: dist.all_reduce(torch.ones(4, device="cuda")))
    return {
        "outcome": str(o),
        "raised": not o.ok,
        "dist_error": o.is_instance("DistBackendError"),
        "msg": o.msg,
        "elapsed_s": o.elapsed_s,
        "later_raised": not later.ok,
        "later_s": later.elapsed_s,
    }


@needs_gpu_path
def test_missing_rank_raises_instead_of_hanging() -> None:
    pg_timeout_s = 10.0
    values = h.run_ranks(
        2,
        _late_rank_worker,
        timeout_s=300,
        pg_timeout_s=pg_timeout_s,
        env={"STRAGG_CUDA_ALLREDUCE": "stragg", "STRAGG_PROFILE": "0"},
    ).values()
    r0 = values[0]
    assert r0["raised"] and r0["dist_error"], r0["outcome"]
    assert "rank 0" in r0["msg"] and "all_reduce #1" in r0["msg"], r0["msg"]
    assert r0["elapsed_s"] < pg_timeout_s + 20, r0["outcome"]
    assert r0["later_raised"] and r0["later_s"] < 5, r0


def _delegated_worker(rank: int, ws: int) -> dict[str, Any]:
    torch.cuda.set_device(rank)
    side = torch.cuda.Stream()
    expected = float(sum(r + 1 for r in range(ws)))
    with torch.cuda.stream(side):
        t = torch.zeros(NUMEL, device="cuda")
        torch.cuda._sleep(50_000_000)
        t.add_(rank + 1)
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        consumer = t * 1.0
        u = torch.full((1000,), float(rank + 1), device="cuda")
        dist.all_reduce(u)
        u2 = u + 0.0
    torch.cuda.synchronize()
    return {
        "async_ok": bool(torch.all(consumer == expected).item()),
        "sync_ok": bool(torch.all(u2 == expected).item()),
        "stats": _stats(),
    }


def test_delegated_to_nccl_stream_semantics() -> None:
    """STRAGG_CUDA_ALLREDUCE=nccl (and builds without the GPU path): NCCL, one GPU per rank."""
    ws = min(2, torch.cuda.device_count())
    values = h.run_ranks(
        ws, _delegated_worker, timeout_s=300, env={"STRAGG_CUDA_ALLREDUCE": "nccl"}
    ).values()
    for rank, v in enumerate(values):
        assert v["async_ok"], f"rank {rank}: consumer after work.wait() saw a stale tensor"
        assert v["sync_ok"], f"rank {rank}: synchronous all_reduce result wrong on its stream"
        assert v["stats"].get("delegated_calls", 0) >= 2, v["stats"]
        assert v["stats"].get("cuda_allreduce_calls", 0) == 0, v["stats"]
