"""Shared helpers for the stragg benchmarks: size parsing, stats, table formatting, launching."""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
import statistics
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent

def parse_size(text: str) -> int:
    """'4KiB', '1MiB', '64MB', '4096' in bytes, by stragg's one size parser (KiB/MiB/GiB are
    powers of 2, KB/MB/GB powers of 10, bare K/M/G rejected as ambiguous)."""
    from stragg._core_loader import load_core

    try:
        return int(load_core().parse_size(text, "size"))
    except Exception as exc:  # stragg's SettingsError: argparse reports a ValueError
        raise ValueError(str(exc).removeprefix("stragg: ")) from exc


def parse_sizes(text: str) -> list[int]:
    return [parse_size(part) for part in text.split(",") if part.strip()]


def default_sizes(lo: int = 4 << 10, hi: int = 256 << 20, factor: int = 4) -> list[int]:
    sizes, s = [], lo
    while s <= hi:
        sizes.append(s)
        s *= factor
    return sizes


def bus_factor(world_size: int) -> float:
    """nccl-tests busbw factor for all_reduce: 2(n-1)/n."""
    return 2.0 * (world_size - 1) / world_size


@dataclass
class Stats:
    """Summary of per-iteration durations (seconds), each already max-reduced over ranks."""

    median: float
    minimum: float
    maximum: float
    p25: float
    p75: float
    count: int

    @classmethod
    def of(cls, samples: list[float]) -> Stats:
        if not samples:
            raise ValueError("no samples")
        s = sorted(samples)
        if len(s) >= 2:
            q = statistics.quantiles(s, n=4, method="inclusive")
            p25, p75 = q[0], q[2]
        else:
            p25 = p75 = s[0]
        return cls(statistics.median(s), s[0], s[-1], p25, p75, len(s))


def _import_stragg_with_extension() -> ModuleType:
    mod = importlib.import_module("stragg")
    # stragg loads its C++ extension lazily (when a group is created): check it up front.
    importlib.import_module("stragg._C")
    return mod


def import_stragg() -> tuple[ModuleType | None, str]:
    """Import the installed stragg (registers the "stragg" backend) and its C++ extension.

    Returns (module or None, reason it is unavailable): a missing or broken install is reported
    (and the benchmark runs Gloo only), not a crash. The source tree is never put on sys.path:
    benchmarks measure what `pip install` built.
    """
    try:
        return _import_stragg_with_extension(), ""
    except ModuleNotFoundError as e:
        if e.name == "stragg":
            hint = "install it: pip install --no-build-isolation ."
            return None, f"module 'stragg' not found ({hint})"
        return None, f"{type(e).__name__}: {e}"
    except (ImportError, OSError, RuntimeError) as e:
        return None, f"{type(e).__name__}: {e}"


def start_overhead_worker(rank: int, ranks: int) -> ModuleType:
    """The start of the overhead benchmarks' rank processes: one thread, stragg imported (raises
    naming the rank if it cannot be), the Gloo default group that carries their control traffic."""
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    stragg_mod, why = import_stragg()
    if stragg_mod is None:
        raise RuntimeError(f"rank {rank}: import stragg failed: {why}")
    dist.init_process_group("gloo", rank=rank, world_size=ranks,
                            timeout=datetime.timedelta(seconds=300))
    return stragg_mod


@contextlib.contextmanager
def reserved_port() -> Iterator[int]:
    """A port the kernel picked, held while the context lasts: bound by this process
    (SO_REUSEADDR, never listening), so no other bind(port 0) or outgoing connection is given it,
    while rank 0's TCPStore (which binds with SO_REUSEADDR) can listen on it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def set_rendezvous_env(port: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)


def eprint(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Test data shared by the benchmarks: integer-valued float32, so every summation order is exact.

DTYPE = torch.float32
ELEM = 4
PATTERN_PERIOD = 1021  # prime, so chunk-misplacement bugs rarely line up with the pattern


def make_data(nbytes: int, rank: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(this rank's input, the expected all_reduce SUM, an output buffer) for nbytes of float32."""
    numel = nbytes // ELEM
    base = (torch.arange(numel, dtype=torch.int32) % PATTERN_PERIOD).to(DTYPE)
    src = base * float(rank + 1)
    # Max value 1020 * n(n+1)/2: an exact integer in float32 for any realistic n.
    expected = base.mul_(float(n * (n + 1) // 2))
    return src, expected, torch.empty_like(src)


def mismatch_detail(buf: torch.Tensor, expected: torch.Tensor) -> str:
    bad = (buf != expected).nonzero()
    if bad.numel() == 0:
        return "no mismatch"
    i = int(bad[0, 0])
    return (
        f"{bad.shape[0]} of {buf.numel()} elements wrong, first at index {i}: "
        f"got {buf[i].item()!r}, expected {expected[i].item()!r}"
    )


def stragg_stats(stragg_mod: Any, group: Any) -> dict[str, Any]:
    """stragg.backend_stats(group), or {"error": ...}: debug info must never fail a benchmark."""
    fn = getattr(stragg_mod, "backend_stats", None) if stragg_mod is not None else None
    if fn is None:
        return {}
    try:
        return dict(fn(group))
    except (RuntimeError, TypeError, ValueError, AttributeError) as e:
        return {"error": f"{type(e).__name__}: {e}"}


def spawn_and_collect(worker: Any, cfg: Any, nprocs: int, prog: str) -> Any | None:
    """Runs worker(rank, cfg, result_path) on `nprocs` spawned ranks; returns the JSON that
    rank 0 wrote to result_path, or None (after saying why on stderr) if a rank failed."""
    import json
    import tempfile

    import torch.multiprocessing as mp

    with reserved_port() as port, tempfile.TemporaryDirectory(prefix=f"stragg-{prog}-") as tmp:
        set_rendezvous_env(port)
        result_path = os.path.join(tmp, "result.json")
        try:
            mp.spawn(worker, args=(cfg, result_path), nprocs=nprocs, join=True)
        except mp.ProcessRaisedException as e:
            eprint(f"{prog}: a rank failed:\n{e}")
            return None
        except mp.ProcessExitedException as e:
            eprint(f"{prog}: a rank died: {e}")
            return None
        with open(result_path) as f:
            return json.load(f)


def fit_ring_alpha_beta(
    n: int, nbytes: list[int], times_s: list[float]
) -> tuple[float, float] | None:
    """alpha (s per round) and beta (s per byte) of the Ring schedule's alpha-beta model
    (stragg.sim) that minimise the relative error against measured times; None if unavailable."""
    try:
        import numpy as np
        import stragg.schedule
        import stragg.sim
    except ImportError:
        return None
    pairs = [(b, t) for b, t in zip(nbytes, times_s) if t > 0]
    if not pairs or n < 2:
        return None
    ring = stragg.schedule.build("ring", n)
    # The model is linear in (alpha, beta): time = alpha * A(S) + beta * B(S).
    rows = [
        (
            stragg.sim.simulate(ring, b, 1.0, 0.0).time / t,
            stragg.sim.simulate(ring, b, 0.0, 1.0).time / t,
        )
        for b, t in pairs
    ]
    (alpha, beta), *_ = np.linalg.lstsq(np.array(rows), np.ones(len(rows)), rcond=None)
    alpha, beta = max(float(alpha), 0.0), max(float(beta), 0.0)
    if alpha == 0.0 and beta == 0.0:
        return None
    return alpha, beta
