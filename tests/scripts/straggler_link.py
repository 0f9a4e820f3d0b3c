"""One host of tests/test_straggler_report.py's emulated-cluster test (started in its namespace by
stragg.emucluster): a few all_reduces, a link probe, a few more, then prints
`REPORT <json>`: stragg.straggler_report(sync=True).to_dict() plus its table under "table"."""

from __future__ import annotations

import json
from datetime import timedelta

import torch
import torch.distributed as dist

import stragg
import stragg.profiler


def main() -> None:
    dist.init_process_group("stragg", timeout=timedelta(seconds=60))
    x = torch.ones(1 << 16)
    for _ in range(8):
        dist.all_reduce(x)
    stragg.profiler.measure_links()
    for _ in range(8):
        dist.all_reduce(x)
    rep = stragg.straggler_report(sync=True)
    out = {**rep.to_dict(), "table": rep.table()}
    print("REPORT " + json.dumps(out, sort_keys=True), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
