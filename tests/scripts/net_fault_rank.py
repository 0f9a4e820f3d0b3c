"""One host of tests/test_net_faults.py (started in its namespace by stragg.emucluster).

A loop of ITERS all_reduces of random float32 data, 4 KiB and 4 MiB calls alternating in blocks,
while the test injects network faults (a reset of host 2's connections, a flap). Each call's
input is seeded by (call, rank), so every run computes the same calls. Prints `iter <k>` after
call k (the test injects its faults from these), then runs the same calls again (the network
is quiet by then) and prints `RESULT <json>`: per call the digest of the faulty pass and of the
quiet one, the worst error against a float64 reference, each call's seconds, and the stragg
TCP counters.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import stragg

TIMEOUT_S = float(os.environ.get("PG_TIMEOUT_S", "30"))
ITERS = int(os.environ.get("ITERS", "40"))
SMALL = 1024  # float32: 4 KiB
LARGE = 1 << 20  # float32: 4 MiB


def numel_of(call: int) -> int:
    return LARGE if (call // 4) % 2 else SMALL  # blocks of four calls of each size


def inputs(call: int, n: int) -> list[torch.Tensor]:
    numel = numel_of(call)
    return [torch.randn(numel, generator=torch.Generator().manual_seed(1000 * call + r))
            for r in range(n)]  # fmt: skip


def one_pass(tag: str) -> tuple[list[str], float, list[float]]:
    rank, n = dist.get_rank(), dist.get_world_size()
    digests, worst, secs = [], 0.0, []
    for call in range(ITERS):
        parts = inputs(call, n)
        x = parts[rank].clone()
        t0 = time.monotonic()
        dist.all_reduce(x)
        secs.append(time.monotonic() - t0)
        ref = torch.stack([p.double() for p in parts]).sum(0)
        worst = max(worst, float(((x.double() - ref).abs() / (ref.abs() + 1.0)).max()))
        digests.append(hashlib.sha256(x.numpy().tobytes()).hexdigest())
        print(f"{tag} {call}", flush=True)
    return digests, worst, secs


def main() -> None:
    dist.init_process_group("stragg", timeout=timedelta(seconds=TIMEOUT_S))
    print("ready", flush=True)
    faulty, worst, secs = one_pass("iter")
    quiet, worst_quiet, _ = one_pass("quiet")
    stats = stragg.backend_stats()
    out = {
        "rank": dist.get_rank(),
        "transport": stats["transport"],
        "faulty": faulty,
        "quiet": quiet,
        "worst_rel_err": max(worst, worst_quiet),
        "secs": secs,
        "stats": {k: v for k, v in stats.items() if k.startswith("tcp_")},
    }
    print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
