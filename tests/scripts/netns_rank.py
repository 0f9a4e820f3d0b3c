"""One rank of tests/test_netns.py, started inside an emulated host's network namespace by
stragg.emucluster, which sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (the TCPStore).

usage: netns_rank.py OUT_JSON MODE

MODE "check": all_reduce over several dtypes, sizes and ops; records a SHA-256 of every result
(for the bitwise comparison across ranks) and whether it matches a float64 / exact reference.
MODE "kill": one all_reduce, then the last rank SIGKILLs itself while rank 0 runs a second
all_reduce; rank 0 records how long it took to raise.
MODE "stop": rank 1 SIGSTOPs itself while every rank runs all_reduces; the others record their
first error; rank 0 then continues rank 1, which records its own.
MODE "mismatch": rank 1 passes 11 elements, the others 10; everybody records the error.
MODE "cut": after a warm-up every rank writes ready.<rank> in $STRAGG_TEST_WORKDIR and waits for
"go" (the test cuts a link in between), then records the error of one all_reduce.
Environment: STRAGG_TEST_PG_TIMEOUT_S (default 120), STRAGG_TEST_TCP_PORT_BASE (rank r listens
on base + r), STRAGG_TEST_WAIT_FOR (a file to wait for before init_process_group).

The result is a JSON object written to OUT_JSON (atomically); the process then exits with
os._exit so that nothing can hang at interpreter shutdown.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta

SIZES = (1, 7, 1000, 262147)
BIG = 4 * 1024 * 1024 + 1  # float32 only: streams through many staging pieces


def make_input(torch, rank: int, numel: int, dtype):
    g = torch.Generator().manual_seed(7919 * rank + numel)
    if dtype.is_floating_point:
        return torch.randn(numel, generator=g, dtype=torch.float64).to(dtype)
    return torch.randint(-1000, 1000, (numel,), generator=g, dtype=dtype)


def reference(torch, world: int, numel: int, dtype, op: str):
    xs = [make_input(torch, r, numel, dtype) for r in range(world)]
    wide = [x.double() if dtype.is_floating_point else x for x in xs]
    out = wide[0].clone()
    for x in wide[1:]:
        out = out + x if op == "sum" else torch.maximum(out, x)
    return out


def run_checks(torch, dist, rank: int, world: int) -> list[dict]:
    cases = [(torch.float32, n, "sum") for n in SIZES + (BIG,)]
    cases += [(torch.float64, n, "sum") for n in SIZES]
    cases += [(torch.int64, n, "sum") for n in SIZES]
    cases += [(torch.float32, 1000, "max")]
    results = []
    for dtype, numel, op in cases:
        t = make_input(torch, rank, numel, dtype)
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        ref = reference(torch, world, numel, dtype, op)
        if dtype.is_floating_point:
            err = (t.double() - ref).abs().max().item()
            tol = 1e-4 * world if dtype == torch.float32 else 1e-10 * world
            ok = err <= tol
        else:
            err = (t - ref).abs().max().item()
            ok = err == 0
        results.append(
            {
                "case": f"{dtype}/{numel}/{op}",
                "sha256": hashlib.sha256(t.numpy().tobytes()).hexdigest(),
                "max_err": float(err),
                "ok": bool(ok),
            }
        )
    return results


def run_kill(torch, dist, rank: int, world: int, result: dict) -> None:
    t = torch.ones(1000)
    dist.all_reduce(t)
    result["first_sum"] = float(t[0])
    if rank == world - 1:
        time.sleep(0.5)  # rank 0 is inside its all_reduce by now, waiting for us
        os.kill(os.getpid(), signal.SIGKILL)
    big = torch.ones(BIG)
    start = time.monotonic()
    try:
        dist.all_reduce(big)
        result["second"] = "completed"
    except Exception as exc:  # noqa: BLE001
        result["second"] = f"{type(exc).__name__}: {exc}"
    result["second_after_s"] = time.monotonic() - start


def _workdir_file(name: str) -> str:
    return os.path.join(os.environ["STRAGG_TEST_WORKDIR"], name)


def _wait_for_file(path: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.02)


def _first_error(torch, dist, x, result: dict, key: str) -> None:
    start = time.monotonic()
    for _ in range(1_000_000):
        try:
            dist.all_reduce(x)
        except Exception as exc:  # noqa: BLE001
            result[key] = f"{type(exc).__name__}: {exc}"
            result[key + "_after_s"] = time.monotonic() - start
            return
    result[key] = "completed"


def run_stop(torch, dist, rank: int, world: int, result: dict) -> None:
    dist.all_reduce(torch.ones(8))
    x = torch.ones(50_000)
    if rank == 1:
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGSTOP)).start()
        _first_error(torch, dist, x, result, "error")
        return
    _first_error(torch, dist, x, result, "error")
    open(_workdir_file(f"raised.{rank}"), "w").close()
    if rank == 0:
        for r in range(world):
            if r != 1:
                _wait_for_file(_workdir_file(f"raised.{r}"))
        with open(_workdir_file("pid.1")) as f:
            os.kill(int(f.read()), signal.SIGCONT)


def run_mismatch(torch, dist, rank: int, world: int, result: dict) -> None:
    dist.all_reduce(torch.ones(8))
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(11 if rank == 1 else 10))
        result["error"] = "completed"
    except Exception as exc:  # noqa: BLE001
        result["error"] = f"{type(exc).__name__}: {exc}"
    result["error_after_s"] = time.monotonic() - start


def run_cut(torch, dist, rank: int, world: int, result: dict) -> None:
    for _ in range(3):
        dist.all_reduce(torch.ones(100_000))
    open(_workdir_file(f"ready.{rank}"), "w").close()
    _wait_for_file(_workdir_file("go"))
    _first_error(torch, dist, torch.ones(100_000), result, "error")


def write_json(path: str, obj: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    out, mode = sys.argv[1], sys.argv[2]
    backend = os.environ.get("STRAGG_TEST_BACKEND", "stragg").strip() or "stragg"
    result: dict = {"rank": rank, "ok": False, "stage": "import"}
    if os.environ.get("STRAGG_TEST_WORKDIR"):
        with open(_workdir_file(f"pid.{rank}"), "w") as f:
            f.write(str(os.getpid()))
    dist = None
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        if backend == "stragg":
            import stragg
        if os.environ.get("STRAGG_TEST_TCP_PORT_BASE"):
            os.environ["STRAGG_TCP_PORT"] = str(int(os.environ["STRAGG_TEST_TCP_PORT_BASE"]) + rank)
        if os.environ.get("STRAGG_TEST_WAIT_FOR"):
            result["stage"] = "waiting to start"
            _wait_for_file(os.environ["STRAGG_TEST_WAIT_FOR"])
        result["stage"] = "init_process_group"
        dist.init_process_group(
            backend,
            init_method=f"tcp://{addr}:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=float(os.environ.get("STRAGG_TEST_PG_TIMEOUT_S", "120"))),
        )
        if backend == "stragg":
            result["stats_before"] = dict(stragg.backend_stats())
        result["stage"] = mode
        if mode == "check":
            result["cases"] = run_checks(torch, dist, rank, world)
            dist.barrier()  # nobody leaves while a peer still runs its last all_reduce
            if backend == "stragg":
                result["stats_after"] = dict(stragg.backend_stats())
        elif mode == "kill":
            run_kill(torch, dist, rank, world, result)
        elif mode == "stop":
            run_stop(torch, dist, rank, world, result)
        elif mode == "mismatch":
            run_mismatch(torch, dist, rank, world, result)
        elif mode == "cut":
            run_cut(torch, dist, rank, world, result)
        else:
            raise ValueError(f"unknown mode {mode!r}")
        result["ok"] = True
        result["stage"] = "done"
    except BaseException as exc:  # noqa: BLE001  # reported to the test, never swallowed
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
    write_json(out, result)
    if dist is not None and mode == "check" and result["ok"]:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
