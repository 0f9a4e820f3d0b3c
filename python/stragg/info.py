"""What a stragg bug report needs: `python -m stragg.info` (add `--json` for one JSON object).

Like `torch.utils.collect_env`: versions (stragg, torch, Python, OS), how stragg was built and
installed (C++ extension, CUDA all_reduce compiled in), CUDA / NCCL as torch sees them, shared
memory (/dev/shm size and free space, mount options), resource limits, the all_reduce transport
that STRAGG_TRANSPORT selects on this host, and the STRAGG_* settings in force (environment and
`stragg.set_policy` / `stragg.profiler.configure` overrides of this process).

`--probe` also creates a 2-rank stragg group on this host (two spawned processes) and reports the
transport it really chose and whether a small all_reduce was correct.

`--report FILE` prints a saved straggler report (StragglerReport.to_json(), see
stragg.straggler) as its table instead.

The collectors are in stragg._info_collect, the text in stragg._info_format. Nothing here fails:
a part that cannot be read is reported as {"error": "..."}.
"""

from __future__ import annotations

import argparse
import json
import sys

from ._info_collect import (
    build,
    collect,
    cuda,
    limits,
    settings,
    shared_memory,
    transport,
    versions,
)
from ._info_format import format_text

__all__ = [
    "build",
    "collect",
    "cuda",
    "format_text",
    "limits",
    "main",
    "settings",
    "shared_memory",
    "transport",
    "versions",
]


def _print_report(path: str) -> int:
    from .straggler import format_report

    try:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
        text = format_report(report)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"python -m stragg.info --report {path}: cannot read a straggler report: "
              f"{type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stragg.info",
        description="Print what a stragg bug report needs: versions, build, CUDA/NCCL, shared "
        "memory, limits, transport for this host and the STRAGG_* settings in force.",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object instead of text")
    parser.add_argument(
        "--probe",
        action="store_true",
        help="also create a 2-rank stragg group on this host and report its transport",
    )
    parser.add_argument(
        "--report",
        metavar="FILE",
        help="print the straggler report saved in FILE (StragglerReport.to_json()) as a table",
    )
    args = parser.parse_args(argv)
    if args.report is not None:
        return _print_report(args.report)
    info = collect(probe=args.probe)
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True, default=str))
    else:
        print(format_text(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
