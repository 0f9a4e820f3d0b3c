"""all_reduce semantics (issue item 5), multi-process, against a float64/exact reference.

One spawn per world size runs every check for that world size (``semantics_worker``); the tests
below then assert on parts of what every rank reported. Every result is compared on every rank
with a reference computed from all ranks' deterministic inputs, and its raw bytes are hashed so
the parent can check that all ranks hold bitwise identical results.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import _harness as h
import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.needs_backend

SEED = 20240611
MIB = 1 << 20
# 16 MiB + 4 bytes of float32: larger than any sane staging buffer, so the executor must chunk.
BIG_F32 = 4 * MIB + 1
ODD_BIG = MIB + 3

FLOAT_OPS = ("SUM", "AVG", "MIN", "MAX", "PRODUCT", "PREMUL_SUM")
INT_OPS = ("SUM", "AVG", "MIN", "MAX", "PRODUCT", "BAND", "BOR", "BXOR")
BOOL_OPS = ("SUM", "MIN", "MAX", "PRODUCT", "BAND", "BOR", "BXOR")
BITWISE = ("BAND", "BOR", "BXOR")


# ----------------------------------------------------------------------------------------------
# What is run (shared by the workers and the tests)
# ----------------------------------------------------------------------------------------------


def ops_for(dtype: torch.dtype) -> tuple[str, ...]:
    if dtype == torch.bool:
        return BOOL_OPS
    if dtype in h.INT_DTYPES:
        return INT_OPS
    return FLOAT_OPS


def unsupported_reason(backend: str, dtype: torch.dtype, op: str) -> str | None:
    """Why ``backend`` cannot be held to the stragg contract for (dtype, op); None if it can."""
    if backend == "stragg":
        return None
    if op == "PREMUL_SUM":
        return f"{backend} has no PREMUL_SUM"
    if op == "AVG" and dtype in h.INT_DTYPES:
        return f"{backend} has no integer AVG"
    return None


Case = tuple[str, str, int]  # (dtype name, op, numel)


PROFILE_DTYPES: dict[str, tuple[torch.dtype, ...]] = {
    "full": h.ALL_DTYPES,
    "medium": h.ALL_DTYPES,
    "local": h.ALL_DTYPES,
    "small": (torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool),
}


def matrix_cases(profile: str, backend: str) -> list[Case]:
    sizes: tuple[int, ...]
    if profile not in PROFILE_DTYPES:
        raise ValueError(profile)
    dtypes = PROFILE_DTYPES[profile]
    if profile == "full":  # world size 4
        sizes = (1, 7, 1023)
        big = [
            ("float32", "SUM", BIG_F32),
            ("float32", "MAX", ODD_BIG),
            ("bfloat16", "SUM", ODD_BIG),
            ("bfloat16", "AVG", ODD_BIG),
            ("float16", "PRODUCT", ODD_BIG),
            ("float64", "PREMUL_SUM", ODD_BIG),
            ("int32", "SUM", ODD_BIG),
            ("int64", "BXOR", ODD_BIG),
            ("uint8", "MIN", ODD_BIG),
            ("bool", "BOR", ODD_BIG),
        ]
    elif profile == "medium":  # world sizes 2 and 3
        sizes = (7, 1023)
        big = [
            ("float32", "SUM", BIG_F32),
            ("bfloat16", "SUM", ODD_BIG),
            ("int64", "SUM", ODD_BIG),
            ("float16", "AVG", ODD_BIG),
        ]
    elif profile == "local":  # world size 1
        sizes = (7,)
        big = [("float32", "SUM", BIG_F32), ("bfloat16", "AVG", ODD_BIG)]
    else:  # "small", world size 8: keep it short
        sizes = (1, 1023)
        big = [("float32", "SUM", ODD_BIG)]
    cases: list[Case] = []
    for dt in dtypes:
        ops = ops_for(dt)
        if profile == "small":
            ops = tuple(o for o in ops if o in ("SUM", "AVG", "MAX", "PRODUCT", "BXOR"))
        for op in ops:
            for n in sizes:
                cases.append((h.dtype_name(dt), op, n))
    cases.extend(big)
    return [c for c in cases if unsupported_reason(backend, h.dtype_from_name(c[0]), c[1]) is None]


def case_key(case: Case) -> str:
    return f"{case[0]}|{case[1]}|n={case[2]}"


def reduce_op(op: str, dtype: torch.dtype) -> Any:
    if op == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(h.PREMUL_FACTOR[dtype])
    return getattr(dist.ReduceOp, op)


# ----------------------------------------------------------------------------------------------
# Worker side
# ----------------------------------------------------------------------------------------------


def _inputs(
    ranks: list[int], numel: int, dtype: torch.dtype, op: str, ws: int
) -> list[torch.Tensor]:
    return [h.make_input(r, ws, numel, dtype, op, SEED) for r in ranks]


def _run_case(rank: int, ranks: list[int], case: Case, group: Any = None) -> dict[str, Any]:
    """all_reduce one case on ``group`` (members ``ranks``, global numbering); check it."""
    dtype, op, n = h.dtype_from_name(case[0]), case[1], case[2]
    ws = len(ranks)
    inputs = _inputs(ranks, n, dtype, op, ws)
    t = inputs[ranks.index(rank)].clone()
    out = h.capture(lambda: dist.all_reduce(t, op=reduce_op(op, dtype), group=group))
    if not out.ok:
        return {"err": f"all_reduce raised: {out}", "digest": None, "nbytes": t.nbytes}
    return {
        "err": h.compare(t, h.reference(inputs, op, ws), op, ws),
        "digest": h.digest(t),
        "nbytes": t.nbytes,
    }


def _section(results: dict[str, Any], name: str, fn: Callable[[], Any]) -> None:
    """Run one section; an exception is recorded instead of aborting the other sections."""
    out = h.capture(fn)
    results[name] = out.value if out.ok else {"__exception__": str(out)}
    results.setdefault("__seconds__", {})[name] = round(out.elapsed_s, 2)


def _stats() -> dict[str, Any] | None:
    return h.backend_stats() if h.is_stragg() else None


def semantics_worker(rank: int, ws: int, profile: str) -> dict[str, Any]:
    backend = h.backend_name()
    everyone = list(range(ws))
    res: dict[str, Any] = {}

    def matrix() -> dict[str, Any]:
        before = _stats()
        out = {case_key(c): _run_case(rank, everyone, c) for c in matrix_cases(profile, backend)}
        after = _stats()
        return {"cases": out, "stats_before": before, "stats_after": after}

    def int_avg_trunc() -> dict[str, Any]:
        # Sums -5, 5, -7, 7, -1, 0: truncation toward zero differs from floor for the negatives.
        sums = [-5, 5, -7, 7, -1, 0]
        t = torch.tensor(sums if rank == 0 else [0] * len(sums), dtype=torch.int32)
        out = h.capture(lambda: dist.all_reduce(t, op=dist.ReduceOp.AVG))
        want = [int(s / ws) for s in sums]  # int() truncates toward zero
        return {
            "outcome": str(out),
            "ok": out.ok,
            "got": t.tolist(),
            "want": want,
            "digest": h.digest(t),
        }

    def complex_sum() -> dict[str, Any]:
        n = 1023
        inputs = [
            torch.complex(
                h.make_input(r, ws, n, torch.float32, "SUM", SEED),
                h.make_input(r, ws, n + 1, torch.float32, "SUM", SEED)[:n],
            )
            for r in everyone
        ]
        t = inputs[rank].clone()
        before = _stats()
        out = h.capture(lambda: dist.all_reduce(t))
        after = _stats()
        err = h.compare(t, h.reference(inputs, "SUM", ws), "SUM", ws) if out.ok else str(out)
        return {"err": err, "digest": h.digest(t), "stats": (before, after)}

    def noncontiguous() -> dict[str, Any]:
        out: dict[str, Any] = {}
        # (a) a transposed 2-D tensor (the view covers its whole storage)
        shape = (33, 31)
        bases = [
            h.make_input(r, ws, 33 * 31, torch.float32, "SUM", SEED).reshape(shape)
            for r in everyone
        ]
        base = bases[rank].clone()
        view = base.t()
        assert not view.is_contiguous()
        o = h.capture(lambda: dist.all_reduce(view))
        ref = h.reference([b.t() for b in bases], "SUM", ws)
        out["transposed"] = {
            "err": h.compare(view, ref, "SUM", ws) if o.ok else str(o),
            "digest": h.digest(view),
        }
        if backend != "stragg":
            return out  # gloo ignores strides of partial views (writes a contiguous prefix)
        # (b) every third element of an int64 buffer; the other elements must stay untouched
        n = 1000
        flat = [h.make_input(r, ws, 3 * n, torch.int64, "MAX", SEED) for r in everyone]
        buf = flat[rank].clone()
        view2 = buf[1::3]
        o = h.capture(lambda: dist.all_reduce(view2, op=dist.ReduceOp.MAX))
        err = (
            h.compare(view2, h.reference([f[1::3] for f in flat], "MAX", ws), "MAX", ws)
            if o.ok
            else str(o)
        )
        untouched = torch.equal(buf[0::3], flat[rank][0::3]) and torch.equal(
            buf[2::3], flat[rank][2::3]
        )
        out["strided_slice"] = {"err": err, "untouched": untouched, "digest": h.digest(view2)}
        # (c) a column of a row-major bf16 matrix (stride 16), SUM
        mats = [
            h.make_input(r, ws, 64 * 16, torch.bfloat16, "SUM", SEED).reshape(64, 16)
            for r in everyone
        ]
        mat = mats[rank].clone()
        col = mat[:, 3]
        o = h.capture(lambda: dist.all_reduce(col))
        err = (
            h.compare(col, h.reference([m[:, 3] for m in mats], "SUM", ws), "SUM", ws)
            if o.ok
            else str(o)
        )
        others = torch.cat([mat[:, :3], mat[:, 4:]], 1)
        want_others = torch.cat([mats[rank][:, :3], mats[rank][:, 4:]], 1)
        out["column"] = {
            "err": err,
            "untouched": torch.equal(others, want_others),
            "digest": h.digest(col),
        }
        return out

    def zero_element() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, t, op in (
            ("float32_sum", torch.empty(0), dist.ReduceOp.SUM),
            ("int64_max_0x5", torch.empty((0, 5), dtype=torch.int64), dist.ReduceOp.MAX),
            ("bool_bor", torch.empty(0, dtype=torch.bool), dist.ReduceOp.BOR),
            ("bfloat16_avg", torch.empty(0, dtype=torch.bfloat16), dist.ReduceOp.AVG),
        ):
            o = h.capture(functools.partial(dist.all_reduce, t, op=op))
            out[name] = {"outcome": str(o), "ok": o.ok, "shape": tuple(t.shape)}
        # The group must still work afterwards.
        t = torch.full((5,), float(rank + 1))
        o = h.capture(lambda: dist.all_reduce(t))
        out["after"] = {
            "ok": o.ok,
            "outcome": str(o),
            "got": t.tolist(),
            "want": [ws * (ws + 1) / 2] * 5,
        }
        return out

    def async_ops() -> dict[str, Any]:
        out: dict[str, Any] = {}
        # wait()
        inputs = _inputs(everyone, 1023, torch.float32, "SUM", ws)
        t = inputs[rank].clone()
        work = dist.all_reduce(t, async_op=True)
        waited = work.wait()
        out["wait"] = {
            "returned": waited,
            "is_completed": work.is_completed(),
            "err": h.compare(t, h.reference(inputs, "SUM", ws), "SUM", ws),
            "digest": h.digest(t),
        }
        # get_future(): value is a list holding the (same) tensor
        inputs = _inputs(everyone, 7, torch.int64, "MAX", ws)
        t = inputs[rank].clone()
        fut = dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True).get_future()
        value = fut.wait()
        out["future"] = {
            "type": type(value).__name__,
            "len": len(value) if isinstance(value, list) else None,
            "same_storage": isinstance(value, list)
            and len(value) == 1
            and value[0].data_ptr() == t.data_ptr(),
            "err": h.compare(value[0], h.reference(inputs, "MAX", ws), "MAX", ws)
            if isinstance(value, list) and value
            else "no tensor in future value",
            "digest": h.digest(t),
        }
        # several outstanding all_reduces: issue all, then wait in reverse order
        big, huge = (ODD_BIG, BIG_F32) if ws < 8 else (4099, 65537)  # keep 8 ranks short
        cases: list[Case] = [
            ("float32", "SUM", 1023),
            ("int64", "MAX", 7),
            ("bfloat16", "SUM", big),
            ("float32", "SUM", huge),
            ("uint8", "BXOR", 1023),
            ("float64", "AVG", 33),
            ("int32", "MIN", 1),
        ]
        tensors, refs, chained = [], [], []
        order: list[int] = []
        for i, (dn, op, n) in enumerate(cases):
            dt = h.dtype_from_name(dn)
            ins = _inputs(everyone, n, dt, op, ws)
            tensors.append(ins[rank].clone())
            refs.append(h.reference(ins, op, ws))
            w = dist.all_reduce(tensors[-1], op=reduce_op(op, dt), async_op=True)
            chained.append(w.get_future().then(lambda f, i=i: order.append(i)))
        for f in reversed(chained):
            f.wait()
        out["outstanding"] = {
            "order": order,
            "errs": [h.compare(t, r, c[1], ws) for t, r, c in zip(tensors, refs, cases)],
            "digests": [h.digest(t) for t in tensors],
        }
        return out

    def subgroups() -> dict[str, Any]:
        out: dict[str, Any] = {}
        g123 = dist.new_group([1, 2, 3], backend=backend)
        pair_a = dist.new_group([0, 1], backend=backend)
        pair_b = dist.new_group([2, 3], backend=backend)
        sub_cases: list[Case] = [
            ("float32", "SUM", 1023),
            ("int32", "MAX", 7),
            ("bfloat16", "AVG", ODD_BIG),
        ]
        if rank in (1, 2, 3):
            before = _stats_group(g123)
            out["g123"] = {case_key(c): _run_case(rank, [1, 2, 3], c, g123) for c in sub_cases}
            out["g123_stats"] = (before, _stats_group(g123))
        members = [0, 1] if rank in (0, 1) else [2, 3]
        pair = pair_a if rank in (0, 1) else pair_b
        out["pair"] = {case_key(c): _run_case(rank, members, c, pair) for c in sub_cases}
        # the default group still works after subgroups were used
        out["default_after"] = _run_case(rank, everyone, ("float32", "SUM", 7))
        return out

    def float_bitwise_and_bool_avg() -> dict[str, Any]:
        # Each expected error runs on a fresh group, so one aborted group cannot mask the next.
        out: dict[str, Any] = {}
        for dt in h.FLOAT_DTYPES:
            for op in BITWISE:
                g = dist.new_group(backend=backend)
                t = torch.ones(7, dtype=dt)
                out[f"{h.dtype_name(dt)}|{op}"] = h.capture(
                    functools.partial(dist.all_reduce, t, op=getattr(dist.ReduceOp, op), group=g)
                )
        g = dist.new_group(backend=backend)
        t = torch.ones(7, dtype=torch.bool)
        out["bool|AVG"] = h.capture(lambda: dist.all_reduce(t, op=dist.ReduceOp.AVG, group=g))
        return out

    _section(res, "matrix", matrix)
    if backend == "stragg":
        _section(res, "int_avg_trunc", int_avg_trunc)
    _section(res, "complex", complex_sum)
    _section(res, "noncontiguous", noncontiguous)
    _section(res, "zero_element", zero_element)
    _section(res, "async", async_ops)
    if ws == 4:
        _section(res, "subgroups", subgroups)
        _section(res, "errors", float_bitwise_and_bool_avg)
    return res


def _stats_group(group: Any) -> dict[str, Any] | None:
    return h.backend_stats(group) if h.is_stragg() else None


# ----------------------------------------------------------------------------------------------
# Parent side: one run per world size, many assertions
# ----------------------------------------------------------------------------------------------

PROFILES = {1: "local", 2: "medium", 3: "medium", 4: "full", 8: "small"}
# World size 3 runs with a tiny staging area (when the backend reads these settings), so that
# every buffer above 4 KiB is split into many pipelined chunks with ragged ends, and with the
# copying receives of every buffer from 4 KiB written by non-temporal stores (the default does
# so only from 32 MiB, above the matrix's sizes).
SMALL_STAGING: dict[str, str | None] = {"STRAGG_SHM_SLOT_BYTES": "4KiB", "STRAGG_SHM_SLOTS": "2"}
STREAMING: dict[str, str | None] = {"STRAGG_STREAMING_BYTES": "4KiB"}
PROFILE_ENV: dict[int, dict[str, str | None]] = {3: {**SMALL_STAGING, **STREAMING}}
SLOW_WORLD_SIZES = {8}
WORLD_SIZES = [
    pytest.param(ws, marks=[pytest.mark.slow] * (ws in SLOW_WORLD_SIZES)) for ws in PROFILES
]
# (world size, dtype) pairs whose matrix has cases: a dtype a profile leaves out is not a test.
MATRIX_PARAMS = [
    pytest.param(
        ws,
        h.dtype_name(dt),
        id=f"ws{ws}-{h.dtype_name(dt)}",
        marks=[pytest.mark.slow] * (ws in SLOW_WORLD_SIZES),
    )
    for ws, profile in PROFILES.items()
    for dt in PROFILE_DTYPES[profile]
]


_RUNS: dict[int, h.RunResult | BaseException] = {}


def _get_run(ws: int) -> h.RunResult:
    """One spawn per world size for the whole module (its failure is cached too)."""
    if ws not in _RUNS:
        try:
            _RUNS[ws] = h.run_ranks(
                ws,
                semantics_worker,
                PROFILES[ws],
                env=PROFILE_ENV.get(ws),
                timeout_s=90 + 30 * ws,
                pg_timeout_s=60,
                check_leaks=False,
            )
        except BaseException as exc:  # noqa: BLE001
            _RUNS[ws] = exc
    got = _RUNS[ws]
    if isinstance(got, BaseException):
        raise got
    return got


@pytest.fixture(scope="module", params=WORLD_SIZES, ids=lambda ws: f"ws{ws}")
def run(request: pytest.FixtureRequest) -> h.RunResult:
    return _get_run(request.param)


@pytest.fixture(scope="module")
def run4() -> h.RunResult:
    """The world-size-4 run, which also checks subgroups and error messages."""
    return _get_run(4)


def _section_of(run: h.RunResult, name: str) -> list[Any]:
    """Per-rank value of one section; fails with every rank's story if a rank died."""
    values = run.values()
    out = []
    for rank, v in enumerate(values):
        sec = v.get(name)
        assert sec is not None, f"rank {rank} has no section {name!r}"
        assert "__exception__" not in sec, f"rank {rank}, section {name!r}: {sec['__exception__']}"
        out.append(sec)
    return out


def _assert_identical(label: str, digests: list[str | None]) -> None:
    assert all(d is not None for d in digests), f"{label}: missing result on some rank: {digests}"
    assert len(set(digests)) == 1, (
        f"{label}: results are not bitwise identical across ranks: "
        + ", ".join(f"rank {r}: {d[:12] if d else d}" for r, d in enumerate(digests))
    )


def test_every_rank_finished_cleanly(run: h.RunResult) -> None:
    run.values()
    assert len(run) in PROFILES


def test_no_leaked_processes_or_shm(run: h.RunResult) -> None:
    run.assert_no_leaks()


@pytest.mark.parametrize(("ws", "dtype"), MATRIX_PARAMS)
def test_matrix_matches_reference(ws: int, dtype: str) -> None:
    run = _get_run(ws)
    secs = _section_of(run, "matrix")
    keys = [k for k in secs[0]["cases"] if k.startswith(dtype + "|")]
    assert keys, f"no {dtype} cases at world size {ws}, although its profile has {dtype}"
    failures = []
    for rank, sec in enumerate(secs):
        for k in keys:
            err = sec["cases"][k]["err"]
            if err is not None:
                failures.append(f"ws={len(run)} rank {rank} {k}: {err}")
    assert not failures, "\n".join(failures[:40])
    # every op applicable to the dtype was exercised
    ops_seen = {k.split("|")[1] for k in keys}
    expected_ops = {
        op
        for op in ops_for(h.dtype_from_name(dtype))
        if unsupported_reason(run.backend, h.dtype_from_name(dtype), op) is None
    }
    if PROFILES[len(run)] == "small":
        expected_ops &= {"SUM", "AVG", "MAX", "PRODUCT", "BXOR"}
    assert ops_seen == expected_ops


def test_matrix_bitwise_identical_across_ranks(run: h.RunResult) -> None:
    secs = _section_of(run, "matrix")
    keys = list(secs[0]["cases"])
    assert len(keys) > 10
    for k in keys:
        _assert_identical(f"ws={len(run)} {k}", [s["cases"][k]["digest"] for s in secs])


def test_sizes_cover_chunking(run: h.RunResult) -> None:
    """The matrix really contains a >16 MiB buffer and an odd 1 MiB+3 buffer (guards the test)."""
    keys = list(_section_of(run, "matrix")[0]["cases"])
    sizes = {int(k.split("n=")[1]) for k in keys}
    assert ODD_BIG in sizes
    if len(run) != 8:
        assert BIG_F32 in sizes


@pytest.mark.stragg_only
def test_backend_stats_count_matrix(run: h.RunResult) -> None:
    """Every all_reduce of the matrix ran on stragg's own executor, none was delegated."""
    secs = _section_of(run, "matrix")
    for rank, sec in enumerate(secs):
        before, after = sec["stats_before"], sec["stats_after"]
        n_calls = len(sec["cases"])
        n_bytes = sum(c["nbytes"] for c in sec["cases"].values())
        want_transport = "local" if len(run) == 1 else "shm"
        assert after["transport"] == want_transport, f"rank {rank}: {after}"
        assert after["allreduce_calls"] - before["allreduce_calls"] == n_calls, (
            f"rank {rank}: {before} -> {after}"
        )
        assert after["allreduce_bytes"] - before["allreduce_bytes"] == n_bytes, (
            f"rank {rank}: {before} -> {after}"
        )
        assert after["delegated_calls"] == before["delegated_calls"], (
            f"rank {rank}: {before} -> {after}"
        )
        if len(run) == 3 and "shm_slot_bytes" in after:  # the small staging really was in use
            assert after["shm_slot_bytes"] == 4096, f"rank {rank}: {SMALL_STAGING} ignored: {after}"
        if "streamed_bytes" in after:  # streaming copies ran where (only where) configured
            streamed = after["streamed_bytes"] - before["streamed_bytes"]
            if len(run) == 3:
                assert streamed > 0, f"rank {rank}: {STREAMING} ignored: {before} -> {after}"
            else:
                assert streamed == 0, f"rank {rank}: streamed below 32 MiB: {before} -> {after}"


@pytest.mark.stragg_only
def test_integer_avg_truncates_toward_zero(run: h.RunResult) -> None:
    secs = _section_of(run, "int_avg_trunc")
    for rank, sec in enumerate(secs):
        assert sec["ok"], f"rank {rank}: integer AVG {sec['outcome']}"
        assert sec["got"] == sec["want"], (
            f"rank {rank}: got {sec['got']} want {sec['want']} (trunc)"
        )
    _assert_identical("int avg", [s["digest"] for s in secs])


def test_complex64_sum(run: h.RunResult) -> None:
    secs = _section_of(run, "complex")
    for rank, sec in enumerate(secs):
        assert sec["err"] is None, f"rank {rank}: {sec['err']}"
        if run.backend == "stragg":
            before, after = sec["stats"]
            assert after["allreduce_calls"] - before["allreduce_calls"] == 1, (
                f"rank {rank}: {sec['stats']}"
            )
    _assert_identical("complex64 sum", [s["digest"] for s in secs])


def test_noncontiguous_written_back_into_view(run: h.RunResult) -> None:
    secs = _section_of(run, "noncontiguous")
    expected = {"transposed"} | ({"strided_slice", "column"} if run.backend == "stragg" else set())
    for rank, sec in enumerate(secs):
        assert set(sec) == expected
        for name, r in sec.items():
            assert r["err"] is None, f"rank {rank} {name}: {r['err']}"
            assert r.get("untouched", True), (
                f"rank {rank} {name}: elements outside the view were modified"
            )
    for name in expected:
        _assert_identical(f"noncontiguous {name}", [s[name]["digest"] for s in secs])


def test_zero_element_tensors(run: h.RunResult) -> None:
    secs = _section_of(run, "zero_element")
    for rank, sec in enumerate(secs):
        for name in ("float32_sum", "int64_max_0x5", "bool_bor", "bfloat16_avg"):
            if name == "bfloat16_avg" and run.backend != "stragg":
                continue
            assert sec[name]["ok"], f"rank {rank} {name}: {sec[name]['outcome']}"
        assert sec["int64_max_0x5"]["shape"] == (0, 5)
        assert sec["after"]["ok"], (
            f"rank {rank}: all_reduce after zero-element ones {sec['after']['outcome']}"
        )
        assert sec["after"]["got"] == sec["after"]["want"]


def test_async_wait(run: h.RunResult) -> None:
    secs = _section_of(run, "async")
    for rank, sec in enumerate(secs):
        w = sec["wait"]
        assert w["returned"] is True, f"rank {rank}: work.wait() returned {w['returned']!r}"
        assert w["is_completed"], f"rank {rank}: work not completed after wait()"
        assert w["err"] is None, f"rank {rank}: {w['err']}"
    _assert_identical("async wait", [s["wait"]["digest"] for s in secs])


def test_async_get_future_value_is_list_of_tensor(run: h.RunResult) -> None:
    secs = _section_of(run, "async")
    for rank, sec in enumerate(secs):
        f = sec["future"]
        assert f["type"] == "list" and f["len"] == 1, f"rank {rank}: future value {f}"
        assert f["same_storage"], (
            f"rank {rank}: future value does not hold the all_reduced tensor itself"
        )
        assert f["err"] is None, f"rank {rank}: {f['err']}"
    _assert_identical("async future", [s["future"]["digest"] for s in secs])


def test_outstanding_async_complete_in_issue_order(run: h.RunResult) -> None:
    secs = _section_of(run, "async")
    for rank, sec in enumerate(secs):
        o = sec["outstanding"]
        bad = [f"#{i}: {e}" for i, e in enumerate(o["errs"]) if e is not None]
        assert not bad, f"rank {rank}: " + "; ".join(bad)
        assert sorted(o["order"]) == list(range(len(o["errs"]))), (
            f"rank {rank}: completions {o['order']}"
        )
        if run.backend == "stragg":  # gloo runs works on several threads: no order promise there
            assert o["order"] == sorted(o["order"]), f"rank {rank}: completion order {o['order']}"
    for i in range(len(secs[0]["outstanding"]["digests"])):
        _assert_identical(f"outstanding #{i}", [s["outstanding"]["digests"][i] for s in secs])


def test_subgroup_of_three(run4: h.RunResult) -> None:
    secs = _section_of(run4, "subgroups")
    assert "g123" not in secs[0], "rank 0 is not a member of new_group([1, 2, 3])"
    keys = list(secs[1]["g123"])
    assert len(keys) == 3
    for rank in (1, 2, 3):
        for k in keys:
            assert secs[rank]["g123"][k]["err"] is None, (
                f"rank {rank} {k}: {secs[rank]['g123'][k]['err']}"
            )
        if run4.backend == "stragg":
            before, after = secs[rank]["g123_stats"]
            assert after["transport"] == "shm", after
            assert after["allreduce_calls"] - before["allreduce_calls"] == len(keys), (
                before,
                after,
            )
    for k in keys:
        _assert_identical(f"g123 {k}", [secs[r]["g123"][k]["digest"] for r in (1, 2, 3)])


def test_two_disjoint_pairs(run4: h.RunResult) -> None:
    secs = _section_of(run4, "subgroups")
    for rank in range(4):
        for k, r in secs[rank]["pair"].items():
            assert r["err"] is None, f"rank {rank} {k}: {r['err']}"
        assert secs[rank]["default_after"]["err"] is None, secs[rank]["default_after"]
    for k in secs[0]["pair"]:
        _assert_identical(f"pair (0,1) {k}", [secs[r]["pair"][k]["digest"] for r in (0, 1)])
        _assert_identical(f"pair (2,3) {k}", [secs[r]["pair"][k]["digest"] for r in (2, 3)])
        # the two pairs reduced different data: their results must differ
        assert secs[0]["pair"][k]["digest"] != secs[2]["pair"][k]["digest"], k
    _assert_identical("default group after subgroups", [s["default_after"]["digest"] for s in secs])


@pytest.mark.parametrize("dtype", [h.dtype_name(d) for d in h.FLOAT_DTYPES])
@pytest.mark.parametrize("op", BITWISE)
def test_bitwise_op_on_float_raises_naming_op(run4: h.RunResult, dtype: str, op: str) -> None:
    for rank, sec in enumerate(_section_of(run4, "errors")):
        outcome: h.Outcome = sec[f"{dtype}|{op}"]
        assert outcome.is_instance("RuntimeError"), f"rank {rank}: {dtype} {op}: {outcome}"
        assert op in outcome.msg, f"rank {rank}: message does not name {op}: {outcome}"


def test_avg_on_bool_raises(run4: h.RunResult) -> None:
    for rank, sec in enumerate(_section_of(run4, "errors")):
        outcome: h.Outcome = sec["bool|AVG"]
        assert outcome.is_instance("RuntimeError"), f"rank {rank}: AVG on bool: {outcome}"
