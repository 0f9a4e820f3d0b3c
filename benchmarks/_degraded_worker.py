"""One host's part of benchmarks/degraded.py (started by stragg.emucluster on every host).

Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (from the cluster), BENCH_CONFIG (JSON:
sizes, reps, backends, timeout_s). Rank 0 prints one line `RESULT <json>`.

Every backend gets its own group; the control group (Gloo, the default group) carries the
barriers and the max-reduction of the per-rank times. Before timing, each stragg group probes its
links (stragg.profiler.measure_links), so the planner knows the degraded ranks from the first call.
Backends are interleaved repetition by repetition (in a seeded random order per repetition, the
same on every rank) so that noise and any after-effect of the previous call hit them alike;
the first call of each is a warm-up and its result is checked exactly (integer-valued float32 data),
as is the last; all stragg variants must agree bitwise.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import statistics
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

import stragg
import stragg.profiler


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine (namespaces share the kernel's /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [float(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def make_group(spec: str, timeout: timedelta) -> Any:
    if spec == "gloo":
        return dist.new_group(backend="gloo", timeout=timeout)
    options = {"algo": spec.split(":", 1)[1] if ":" in spec else "auto"}
    return dist.new_group(backend="stragg", timeout=timeout, pg_options=options)


def main() -> None:
    cfg = json.loads(os.environ["BENCH_CONFIG"])
    timeout = timedelta(seconds=cfg["timeout_s"])
    dist.init_process_group("gloo", timeout=timeout)
    rank, n = dist.get_rank(), dist.get_world_size()
    groups = {b: make_group(b, timeout) for b in cfg["backends"]}
    probes: dict[str, Any] = {}
    for b, g in groups.items():
        if b != "gloo":
            t0 = time.perf_counter()
            stragg.profiler.measure_links(g)
            st = stragg.backend_stats(g)
            probes[b] = {
                "seconds": time.perf_counter() - t0,
                "degraded": {str(k): v for k, v in st["degraded_ranks"].items()},
                "links": st["links"],
                "alpha_s": stragg.profiler.summary(g)["link"]["alpha_s"],
            }
    rows = []
    for nbytes in cfg["sizes"]:
        numel = nbytes // 4
        src = (torch.arange(numel, dtype=torch.float32) % 251) + rank
        expected = (torch.arange(numel, dtype=torch.float32) % 251) * n + n * (n - 1) / 2
        buf = torch.empty_like(src)
        samples: dict[str, list[float]] = {b: [] for b in groups}
        digests: dict[str, str] = {}
        busy0, total0 = cpu_times()
        for rep in range(cfg["reps"] + 1):
            # A fresh order per repetition, the same on every rank: a rotation would keep each
            # backend behind the same predecessor, whose after-effects it would always pay.
            order = list(groups)
            random.Random(f"{nbytes}/{rep}").shuffle(order)
            for b in order:
                buf.copy_(src)
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(buf, group=groups[b])
                dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                dist.all_reduce(dt, op=dist.ReduceOp.MAX)
                if rep == 0 or rep == cfg["reps"]:
                    if not torch.equal(buf, expected):
                        raise RuntimeError(f"rank {rank}: {b} all_reduce of {nbytes} B is wrong")
                    digests[b] = hashlib.sha256(buf.numpy().tobytes()).hexdigest()
                if rep > 0:
                    samples[b].append(float(dt))
        busy1, total1 = cpu_times()
        row: dict[str, Any] = {"bytes": nbytes, "cpu_busy": (busy1 - busy0) / max(1.0, total1 - total0)}
        for b, g in groups.items():
            s = sorted(samples[b])
            entry: dict[str, Any] = {"median_s": s[len(s) // 2], "min_s": s[0], "max_s": s[-1],
                                     "samples_s": s}
            if b != "gloo":
                # The timed calls' records: which plans ran (auto may switch after a re-probe)
                # and where their time went.
                timed = [c for c in stragg.recent_calls(g) if c["bytes"] == nbytes][-cfg["reps"]:]
                entry["plan"] = timed[-1]["plan"]
                entry["predicted_s"] = timed[-1]["predicted_s"]
                entry["plans"] = dict(Counter(c["plan"] for c in timed))
                for key in ("queued_s", "agreement_s", "run_s"):
                    entry[key] = statistics.median(c[key] for c in timed)
            row[b] = entry
        if len({d for k, d in digests.items()}) != 1:
            raise RuntimeError(f"rank {rank}: results differ between backends: {digests}")
        rows.append(row)
    if rank == 0:
        print("RESULT " + json.dumps({"n": n, "probes": probes, "rows": rows}), flush=True)
    for g in groups.values():
        dist.destroy_process_group(g)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
