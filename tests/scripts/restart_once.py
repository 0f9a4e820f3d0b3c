"""A torchrun worker for tests/test_restarts.py: plain env:// init_process_group. In the first
attempt (TORCHELASTIC_RESTART_COUNT=0) rank 1 exits with status 3 after one all_reduce, so the
agent restarts every worker; in the next attempt every rank runs all_reduces and a barrier and
writes $STRAGG_TEST_RESULT_DIR/attempt<N>-rank<R>.json.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist


def main() -> int:
    backend = os.environ.get("STRAGG_TEST_BACKEND", "stragg")
    if backend == "stragg":
        import stragg  # noqa: F401

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group(backend)
    rank, ws = dist.get_rank(), dist.get_world_size()
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    if attempt == 0 and rank == 1:
        sys.stdout.flush()
        os._exit(3)  # the failure torchrun restarts the job for
    sums = [t[0].item()]
    for n in (1, 4097, 300_000):
        x = torch.full((n,), float(rank + 1))
        dist.all_reduce(x)
        sums.append(x[-1].item())
    dist.barrier()
    out = {
        "attempt": attempt,
        "rank": rank,
        "world_size": ws,
        "sums_ok": all(s == ws * (ws + 1) / 2 for s in sums),
        "backend": dist.get_backend(),
    }
    path = os.path.join(os.environ["STRAGG_TEST_RESULT_DIR"], f"attempt{attempt}-rank{rank}.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(out, fh)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
