"""`python -m stragg.info --probe`: a real 2-rank stragg group on this host.

Two spawned processes meet through a FileStore in a temporary directory, create a stragg group,
all_reduce a small tensor and report the transport and algorithm the backend chose.
"""

from __future__ import annotations

import os
import queue as queue_module
import tempfile
from datetime import timedelta
from typing import Any

WORLD = 2
TIMEOUT_S = 60


def _worker(rank: int, store_path: str, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    import stragg

    try:
        store = dist.FileStore(store_path, WORLD)
        dist.init_process_group(
            "stragg", store=store, rank=rank, world_size=WORLD, timeout=timedelta(seconds=30)
        )
        t = torch.arange(1000, dtype=torch.float32) * (rank + 1)
        dist.all_reduce(t)
        ok = bool(torch.equal(t, torch.arange(1000, dtype=torch.float32) * 3))
        stats = stragg.backend_stats()
        dist.destroy_process_group()
        queue.put(
            (rank, {"transport": stats["transport"], "algorithm": stats["algorithm"], "ok": ok})
        )
    except Exception as e:  # noqa: BLE001 - reported by the parent
        queue.put((rank, {"error": f"{type(e).__name__}: {e}"}))


def probe_transport() -> dict[str, Any]:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="stragg-info-") as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_worker, args=(r, store_path, queue)) for r in range(WORLD)]
        for p in procs:
            p.start()
        results: dict[int, dict[str, Any]] = {}
        for _ in range(WORLD):
            try:
                rank, res = queue.get(timeout=TIMEOUT_S)
            except queue_module.Empty:  # a rank hung or died: reported below
                break
            results[rank] = res
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    errors = [f"rank {r}: {res['error']}" for r, res in sorted(results.items()) if "error" in res]
    if errors:
        return {"error": "; ".join(errors)}
    if len(results) < WORLD:
        missing = sorted(set(range(WORLD)) - set(results))
        return {"error": f"no answer from rank(s) {missing} within {TIMEOUT_S} s"}
    first = results[0]
    return {
        "world_size": WORLD,
        "transport": first["transport"],
        "algorithm": first["algorithm"],
        "ok": all(r["ok"] for r in results.values()),
    }
