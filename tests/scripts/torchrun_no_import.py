"""Run under torchrun. Uses backend "stragg" WITHOUT importing the stragg package itself: the
backend must come from PyTorch's extension autoload (entry point group "torch.backends").

The backend name can be overridden with STRAGG_TEST_BACKEND (to validate this script on gloo).
Each rank writes its checks as JSON to $STRAGG_TEST_RESULT_DIR/rank<N>.json (or prints one line
"RESULT {json}" when that variable is unset); exits non-zero on any failed check.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist


def main() -> int:
    backend = os.environ.get("STRAGG_TEST_BACKEND", "stragg")
    dist.init_process_group(backend=backend)
    rank, ws = dist.get_rank(), dist.get_world_size()
    checks: dict[str, object] = {"rank": rank, "world_size": ws, "backend": dist.get_backend()}
    ok = dist.get_backend() == backend

    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    want = ws * (ws + 1) / 2
    checks["sum_ok"] = bool((t == want).all())

    t = torch.arange(7, dtype=torch.int64) * (rank + 1)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True).wait()
    checks["max_ok"] = t.tolist() == [i * ws for i in range(7)]

    b = torch.full((3,), float(rank))
    dist.broadcast(b, src=ws - 1)
    checks["broadcast_ok"] = b.tolist() == [float(ws - 1)] * 3
    ok = ok and bool(checks["sum_ok"]) and bool(checks["max_ok"]) and bool(checks["broadcast_ok"])

    if backend == "stragg":
        module = sys.modules.get("stragg")  # loaded by torch's autoload, not by this script
        checks["module_loaded_by_autoload"] = module is not None
        if module is not None:
            stats = dict(module.backend_stats())
            checks["stats"] = stats
            ok = (
                ok and stats.get("transport") == "shm" and int(stats.get("allreduce_calls", 0)) >= 2
            )
        else:
            ok = False
    checks["ok"] = ok
    dist.barrier()
    dist.destroy_process_group()
    text = json.dumps(checks, sort_keys=True)
    out_dir = os.environ.get("STRAGG_TEST_RESULT_DIR")
    if out_dir:  # one file per rank: stdout lines of 4 ranks may interleave under torchrun
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        print("RESULT " + text, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
