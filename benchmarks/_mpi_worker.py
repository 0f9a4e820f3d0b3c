"""OpenMPI side of benchmarks/allreduce.py: a rank of `mpirun -np P python _mpi_worker.py CFG OUT`.

mpi4py on numpy buffers (torch only for the dispatch repetitions below). Reads the run's
configuration from the JSON file CFG ({"sizes", "warmup", "reps", "budget_s", "max_calls",
"min_calls", "dispatch_max_bytes"}) and times, per size, exactly like the torch worker of
allreduce.py (the OSU osu_allreduce method, osu_repetition below, shared by both): a warm-up
repetition of W calls, one of W/5 calls estimating the rate, then R repetitions of [barrier,
`calls` back-to-back Allreduce(SUM, float32), mean per call]; a repetition's value is the
slowest rank's mean. The first warm-up result and the last measured result are checked exactly
against the expected sum (integer-valued float32 data, as in _common.make_data). Rank 0 writes
{"library", "sizes": {bytes: {"samples": [s], "calls"}}} to OUT.

Sizes up to "dispatch_max_bytes" (0: none) are then also timed with torch's dispatch of
`dist.all_reduce` added to every call: each call is `dist.all_reduce` on a group of torch's
`fake` backend (which moves no data; the call allreduce.py's floor times) followed by the MPI
Allreduce, R more repetitions of as many calls ("dispatch_samples"). That is what OpenMPI's
all_reduce would cost reached through `dist.all_reduce` (torch's CPU wheel has no MPI backend):
the peer a torch backend can be held to where torch's own per-call cost is a large part of the
time. torch is imported only then.

The helpers above main() are also imported by allreduce.py (this module imports mpi4py only
in main()).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Callable

import numpy as np

PATTERN_PERIOD = 1021  # as _common.make_data


def make_data(nbytes: int, rank: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    base = (np.arange(nbytes // 4, dtype=np.int32) % PATTERN_PERIOD).astype(np.float32)
    src = base * np.float32(rank + 1)
    expected = base * np.float32(n * (n + 1) // 2)
    return src, expected, np.empty_like(src)


def calls_for(budget_s: float, est_s: float, max_calls: int, min_calls: int) -> int:
    """Back-to-back calls of one repetition: about `budget_s` of calls at the warm-up's mean
    `est_s` per call, within [min_calls, max_calls]; budget 0: always max_calls."""
    if budget_s <= 0:
        return max_calls
    return min(max_calls, max(min_calls, int(budget_s / max(est_s, 1e-9))))


def osu_repetition(
    call: Callable[[], None],
    barrier: Callable[[], None],
    max_over_ranks: Callable[[float], float],
    calls: int,
) -> float:
    """One repetition of the OSU osu_allreduce method: barrier, `calls` back-to-back calls, mean
    per call; returns the slowest rank's mean (the same value on every rank). Shared by the
    torch and the MPI workers, so both systems are timed identically."""
    barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    return max_over_ranks((time.perf_counter() - t0) / calls)


def check(comm: Any, buf: np.ndarray, expected: np.ndarray, nbytes: int) -> None:
    bad = int(not np.array_equal(buf, expected))
    bad_ranks = comm.allgather(bad)
    if any(bad_ranks):
        wrong = [r for r, b in enumerate(bad_ranks) if b]
        raise SystemExit(f"_mpi_worker: MPI Allreduce of {nbytes} B wrong on ranks {wrong}")


def time_size(
    comm: Any, mpi: Any, nbytes: int, cfg: dict[str, Any], dispatch: Any = None
) -> dict[str, Any]:
    """Samples of one size: {"samples", "calls"}, and "dispatch_samples" when `dispatch` (a
    TorchDispatch) is given."""
    rank, n = comm.Get_rank(), comm.Get_size()
    src, expected, buf = make_data(nbytes, rank, n)

    def call() -> None:
        comm.Allreduce(src, buf, op=mpi.SUM)

    def max_over_ranks(x: float) -> float:
        return float(comm.allreduce(x, op=mpi.MAX))

    call()
    check(comm, buf, expected, nbytes)
    osu_repetition(call, comm.Barrier, max_over_ranks, max(1, cfg["warmup"]))
    est = osu_repetition(call, comm.Barrier, max_over_ranks, max(1, cfg["warmup"] // 5))
    calls = calls_for(cfg["budget_s"], est, cfg["max_calls"], cfg["min_calls"])
    out: dict[str, Any] = {
        "calls": calls,
        "samples": [
            osu_repetition(call, comm.Barrier, max_over_ranks, calls) for _ in range(cfg["reps"])
        ],
    }
    if dispatch is not None:  # after the plain repetitions, as allreduce.py's floor
        tensor = dispatch.tensor_of(src)

        def dispatched_call() -> None:
            dispatch.all_reduce(tensor)
            call()

        osu_repetition(dispatched_call, comm.Barrier, max_over_ranks, max(1, cfg["warmup"]))
        out["dispatch_samples"] = [
            osu_repetition(dispatched_call, comm.Barrier, max_over_ranks, calls)
            for _ in range(cfg["reps"])
        ]
    check(comm, buf, expected, nbytes)
    return out


class TorchDispatch:
    """torch's dispatch of `dist.all_reduce` without any communication: a process group of
    torch's `fake` backend (a FakeStore, no rendezvous), one per rank."""

    def __init__(self, rank: int, n: int) -> None:
        import torch
        import torch.distributed as dist
        from torch.testing._internal.distributed.fake_pg import FakeStore

        torch.set_num_threads(1)  # as the torch ranks of allreduce.py
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=n)
        self._torch, self._dist = torch, dist

    def tensor_of(self, array: Any) -> Any:
        return self._torch.from_numpy(array)

    def all_reduce(self, tensor: Any) -> None:
        self._dist.all_reduce(tensor, op=self._dist.ReduceOp.SUM)

    def close(self) -> None:
        self._dist.destroy_process_group()


def main(argv: list[str]) -> int:
    cfg_path, out_path = argv[1], argv[2]
    with open(cfg_path) as f:
        cfg = json.load(f)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    limit = int(cfg.get("dispatch_max_bytes", 0))
    dispatch = None
    if any(nbytes <= limit for nbytes in cfg["sizes"]):
        dispatch = TorchDispatch(comm.Get_rank(), comm.Get_size())
    result = {}
    for nbytes in cfg["sizes"]:
        dispatched = dispatch if nbytes <= limit else None
        result[str(nbytes)] = time_size(comm, MPI, nbytes, cfg, dispatched)
    if dispatch is not None:
        dispatch.close()
    if comm.Get_rank() == 0:
        with open(out_path, "w") as f:
            # Open MPI pads its version string with NUL characters.
            library = MPI.Get_library_version().replace("\x00", "").splitlines()[0].strip()
            json.dump({"library": library, "sizes": result}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
