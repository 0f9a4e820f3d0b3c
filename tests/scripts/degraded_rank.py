"""One host of tests/test_degraded_network.py (started in its namespace by stragg.emucluster).

MODE=detect: probes the links, all_reduces once on stragg's default choice and once on Ring, and
prints `RESULT <json>` (degraded ranks, the plan that ran, digests, correctness).
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
    else:
        cut()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
