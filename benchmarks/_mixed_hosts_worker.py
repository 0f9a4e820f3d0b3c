"""One rank of benchmarks/mixed_hosts.py (started by stragg.emucluster, K ranks per host).

Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (from the cluster), BENCH_CONFIG (JSON:
sizes, reps, backends, timeout_s). Rank 0 prints one line `RESULT <json>`.

Backends: "gloo", or "stragg:<transport>:<algo>" (a group with pg_options transport and algo).
The default group (Gloo) carries the barriers and the max-reduction of the per-rank times.
Backends are interleaved repetition by repetition (rotating order) so that noise hits them alike;
the first call of each is a warm-up, and the first and last results are checked exactly
(integer-valued float32) and must agree bitwise across backends.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

import stragg


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine (namespaces share the kernel's /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [float(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def make_group(spec: str, timeout: timedelta) -> Any:
    if spec == "gloo":
        return dist.new_group(backend="gloo", timeout=timeout)
    _, transport, algo = spec.split(":")
    return dist.new_group(backend="stragg", timeout=timeout,
                          pg_options={"transport": transport, "algo": algo, "profile": False})


def time_backends(groups: dict[str, Any], nbytes: int, reps: int, rank: int, n: int) -> dict:
    numel = nbytes // 4
    src = (torch.arange(numel, dtype=torch.float32) % 251) + rank
    expected = (torch.arange(numel, dtype=torch.float32) % 251) * n + n * (n - 1) / 2
    buf = torch.empty_like(src)
    samples: dict[str, list[float]] = {b: [] for b in groups}
    digests: dict[str, str] = {}
    busy0, total0 = cpu_times()
    order = list(groups)
    for rep in range(reps + 1):
        for b in order[rep % len(order):] + order[: rep % len(order)]:
            buf.copy_(src)
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(buf, group=groups[b])
            dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            if rep in (0, reps):
                if not torch.equal(buf, expected):
                    raise RuntimeError(f"rank {rank}: {b} all_reduce of {nbytes} B is wrong")
                digests[b] = hashlib.sha256(buf.numpy().tobytes()).hexdigest()
            if rep > 0:
                samples[b].append(float(dt))
    busy1, total1 = cpu_times()
    if len(set(digests.values())) != 1:
        raise RuntimeError(f"rank {rank}: results differ between backends: {digests}")
    row: dict[str, Any] = {"bytes": nbytes,
                           "cpu_busy": (busy1 - busy0) / max(1.0, total1 - total0)}
    for b, g in groups.items():
        s = sorted(samples[b])
        entry: dict[str, Any] = {"median_s": s[len(s) // 2], "min_s": s[0], "max_s": s[-1],
                                 "samples_s": s}
        if b != "gloo":
            entry["plan"] = stragg.recent_calls(g)[-1]["plan"]
            st = stragg.backend_stats(g)
            entry["transport"] = st["transport"]
            entry["relayed_wakeups"] = st.get("relayed_wakeups", 0)
            entry["helper_handbacks"] = st.get("helper_handbacks", 0)
            entry["calls"] = st["allreduce_calls"]
        row[b] = entry
    return row


def main() -> None:
    cfg = json.loads(os.environ["BENCH_CONFIG"])
    timeout = timedelta(seconds=cfg["timeout_s"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timeout)
    rank, n = dist.get_rank(), dist.get_world_size()
    groups = {b: make_group(b, timeout) for b in cfg["backends"]}
    rows = [time_backends(groups, nbytes, cfg["reps"], rank, n) for nbytes in cfg["sizes"]]
    if rank == 0:
        print("RESULT " + json.dumps({"n": n, "rows": rows}), flush=True)
    for g in groups.values():
        dist.destroy_process_group(g)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
