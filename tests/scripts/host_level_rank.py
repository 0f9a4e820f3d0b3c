"""One rank of tests/test_host_level.py: 2 emulated hosts x 2 ranks with shaped links
(stragg.emucluster sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

usage: host_level_rank.py OUT_DIR CALLS LATE_RANK DELAY_S   (LATE_RANK -1: nobody late)

CALLS all_reduces of 1 MiB of integer-valued float32 (stragg's defaults: the planner, the
profiler and the plan check decide), LATE_RANK sleeping DELAY_S before each. Per call: whether
the result equals the float64 reference exactly, its SHA-256 digest (compared across ranks by
the test) and the plan that ran. Writes OUT_DIR/rank<RANK>.json; ends with os._exit.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

import stragg
import stragg.profiler

NUMEL = 1 << 18


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    out_dir, calls, late, delay = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    result: dict = {"rank": rank, "ok": False}
    torch.set_num_threads(1)
    try:
        dist.init_process_group("stragg", timeout=timedelta(seconds=120))
        exact, digests = [], []
        for i in range(calls):
            base = (torch.arange(NUMEL, dtype=torch.float64) * (i + 1)) % 97
            t = (base + rank).float()
            reference = base * world + world * (world - 1) / 2  # float64, exact in float32
            if rank == late:
                time.sleep(delay)
            dist.all_reduce(t)
            exact.append(bool(torch.equal(t.double(), reference)))
            digests.append(hashlib.sha256(t.numpy().tobytes()).hexdigest())
        records = stragg.recent_calls()
        summary = stragg.profiler.summary()
        result.update({
            "transport": stragg.backend_stats()["transport"],
            "exact": exact, "digests": digests, "plans": [c["plan"] for c in records],
            "plan_checks": summary["plan_checks"], "mode": summary["applied"]["mode"],
            "straggler": summary["applied"]["straggler"],
            "decisions": summary["decisions"], "ok": True,
        })  # fmt: skip
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001  (reported to the test)
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
