"""One host of tests/test_degraded_network.py (started in its namespace by stragg.emucluster).

MODE=detect: probes the links, all_reduces once on stragg's default choice and once on Ring, and
prints `RESULT <json>` (degraded ranks, the plan that ran, digests, correctness).
MODE=lossy: all_reduces random float32 data several times on stragg's default choice and on
Ring and prints `RESULT <json>` (digest per algorithm, worst error against a float64 reference).
MODE=cut: all_reduces in a loop (printing `ready` once running) until it raises; prints
`RAISED <seconds> <message>`.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import stragg
import stragg.profiler

TIMEOUT_S = float(os.environ.get("PG_TIMEOUT_S", "60"))


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def detect() -> None:
    rank, n = dist.get_rank(), dist.get_world_size()
    stragg.profiler.measure_links()
    stats = stragg.backend_stats()
    numel = int(os.environ.get("NUMEL", str(1 << 20)))
    base = torch.arange(numel, dtype=torch.float32) % 1021
    expected = base * n + n * (n - 1) / 2
    x = base + rank
    dist.all_reduce(x)
    plan = stragg.recent_calls()[-1]["plan"]
    ring = dist.new_group(backend="stragg", pg_options={"algo": "ring"})
    y = base + rank
    dist.all_reduce(y, group=ring)
    out = {
        "rank": rank,
        "transport": stats["transport"],
        "degraded": {str(k): v for k, v in stats["degraded_ranks"].items()},
        "plan": plan,
        "exact": bool(torch.equal(x, expected)),
        "digest": digest(x),
        "ring_digest": digest(y),
    }
    print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group(ring)


def lossy() -> None:
    """Several calls per algorithm over a lossy network: TCP retransmits, stragg must still be
    exact (integers) and bitwise identical on every rank (random floats)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    numel = int(os.environ.get("NUMEL", str(1 << 20)))
    ring = dist.new_group(backend="stragg", pg_options={"algo": "ring"})
    out: dict[str, object] = {"rank": rank}
    for name, group in (("auto", None), ("ring", ring)):
        digests, worst, exact = [], 0.0, True
        for call in range(3):
            parts = [torch.randn(numel, generator=torch.Generator().manual_seed(100 * call + r))
                     for r in range(n)]  # fmt: skip
            reference = torch.stack([p.double() for p in parts]).sum(0)
            x = parts[rank].clone()
            dist.all_reduce(x, group=group)
            worst = max(worst, float((x.double() - reference).abs().max()))
            digests.append(digest(x))
            ints = torch.arange(numel, dtype=torch.float32) % 1021 + rank
            dist.all_reduce(ints, group=group)
            exact &= bool(torch.equal(ints, (torch.arange(numel) % 1021 * n).float()
                                      + n * (n - 1) / 2))  # fmt: skip
        out[name] = {"digests": digests, "worst_abs_err": worst, "exact": exact,
                     "plan": stragg.recent_calls(group)[-1]["plan"]}  # fmt: skip
    print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group(ring)


def cut() -> None:
    x = torch.ones(1 << 18)
    print("ready", flush=True)
    t0 = time.monotonic()
    try:
        while True:
            dist.all_reduce(x)
            x.fill_(1.0)
            t0 = time.monotonic()
    except Exception as exc:  # noqa: BLE001  (reported to the test, which checks the type)
        msg = f"{type(exc).__name__}: {exc}".replace("\n", " ")
        print(f"RAISED {time.monotonic() - t0:.2f} {msg}", flush=True)
        sys.exit(3)


def main() -> None:
    dist.init_process_group("stragg", timeout=timedelta(seconds=TIMEOUT_S))
    if os.environ["MODE"] == "detect":
        detect()
    elif os.environ["MODE"] == "lossy":
        lossy()
    else:
        cut()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
