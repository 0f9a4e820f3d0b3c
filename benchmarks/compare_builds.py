"""Before/after: benchmarks/allreduce.py of two stragg installs, interleaved in one run.

    python benchmarks/compare_builds.py --before /path/to/old/.venv/bin/python \\
        --after .venv/bin/python --ranks 4 --sizes 4KiB,64KiB,1MiB,16MiB,64MiB --repeats 5

Each install runs its own copy of the benchmark (`--before-script` / `--after-script`, default:
this checkout's benchmarks/allreduce.py) with `--json`, stragg and Gloo side by side; the two
installs alternate (before, after, after, before, ...) so that machine noise hits both alike.
Per size the table shows the median over repetitions of each install's median stragg time, the
ratio after/before with its spread (min..max of per-repetition ratios), and Gloo's ratio as a
control (Gloo is the same code in both runs, so its ratio shows the noise).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def run_once(python: str, script: str, args: list[str]) -> list[dict[str, Any]]:
    out = subprocess.run(
        [python, script, "--json", *args], check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def times(rows: list[dict[str, Any]], backend: str) -> dict[int, float]:
    return {r["bytes"]: r["time_s"] for r in rows if r["backend"] == backend}


def fmt_size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="python of the old install")
    p.add_argument("--after", default=sys.executable, help="python of the new install")
    p.add_argument("--before-script", default=str(HERE / "allreduce.py"))
    p.add_argument("--after-script", default=str(HERE / "allreduce.py"))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", action="store_true", help="print one JSON object, nothing else")
    args, bench_args = p.parse_known_args(argv)
    runs: dict[str, list[list[dict[str, Any]]]] = {"before": [], "after": []}
    for i in range(args.repeats):
        order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
        for which in order:
            python = args.before if which == "before" else args.after
            script = args.before_script if which == "before" else args.after_script
            runs[which].append(run_once(python, script, bench_args))
            if not args.json:
                print(f"# repetition {i + 1}/{args.repeats}: {which} done", file=sys.stderr)
    sizes = sorted(times(runs["after"][0], "stragg"))
    table = []
    for size in sizes:
        row: dict[str, Any] = {"bytes": size}
        for backend in ("stragg", "gloo"):
            b = [times(r, backend).get(size) for r in runs["before"]]
            a = [times(r, backend).get(size) for r in runs["after"]]
            if None in a or None in b:
                continue
            ratios = [x / y for x, y in zip(a, b)]
            row[backend] = {
                "before_s": statistics.median(b),
                "after_s": statistics.median(a),
                "ratio": statistics.median(ratios),
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
            }
        table.append(row)
    if args.json:
        print(json.dumps({"repeats": args.repeats, "args": bench_args, "rows": table}))
        return 0
    print(f"# allreduce.py {' '.join(bench_args)}; {args.repeats} interleaved repetitions")
    print(f"{'size':>8} {'stragg before':>14} {'after':>10} {'after/before':>22} "
          f"{'gloo after/before':>22}")
    for row in table:
        s, g = row.get("stragg"), row.get("gloo")
        line = f"{fmt_size(row['bytes']):>8}"
        if s:
            line += (f" {s['before_s'] * 1e6:>11.1f} us {s['after_s'] * 1e6:>7.1f} us "
                     f"{s['ratio']:>7.3f} [{s['ratio_min']:.2f}, {s['ratio_max']:.2f}]")
        if g:
            line += f" {g['ratio']:>9.3f} [{g['ratio_min']:.2f}, {g['ratio_max']:.2f}]"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
