"""all_reduce where several ranks share a host: stragg's mixed transport (shared memory to the
host mates, TCP to the other hosts) vs stragg all-TCP vs Gloo, on an emulated cluster.

    sudo python benchmarks/mixed_hosts.py --hosts 2 --per-host 2 --rate 1gbit --sizes 16MiB
    python benchmarks/mixed_hosts.py --algos auto,ring --json

One stragg.emucluster cluster (--hosts network namespaces on a bridge, every host link shaped to
--rate both ways with tc htb; --rate none: unshaped veth) runs benchmarks/_mixed_hosts_worker.py
--per-host times on every host. Columns per (size, algorithm), median of --reps interleaved
repetitions (spread min..max):

  gloo         Gloo's all_reduce
  tcp          stragg with STRAGG_TRANSPORT=tcp: every pair over TCP (host mates over loopback)
  mixed        stragg with STRAGG_TRANSPORT=mixed (what auto picks here)
  ring bound   2 (n-1)/n * S over a host link, in ms (Ring's cross-host traffic per host NIC
               with the ranks of a host adjacent in the ring: one stream out and one in per
               host; RHD crosses hosts with less and can beat it)

The CPU busy share of the machine's cores during the timed loops tells whether the network or the
CPUs set the pace. Needs root (network namespaces).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from stragg import _core
from stragg.emucluster.net import parse_rate
from stragg.emucluster import EmuCluster

HERE = Path(__file__).resolve().parent
GOODPUT = 0.956  # payload share of htb's shaped rate (1448 of 1514 bytes per frame)


def run(args: argparse.Namespace) -> dict[str, Any]:
    backends = ["gloo"] + [f"stragg:{t}:{a}" for a in args.algos for t in ("tcp", "mixed")]
    cfg = {"sizes": args.sizes, "reps": args.reps, "backends": backends,
           "timeout_s": args.timeout}
    with EmuCluster(hosts=args.hosts, rate=args.rate, name="benchmix") as c:
        env = {"BENCH_CONFIG": json.dumps(cfg), "OMP_NUM_THREADS": "1"}
        res = c.run([sys.executable, str(HERE / "_mixed_hosts_worker.py")],
                    timeout=args.timeout * 4, nproc_per_node=args.per_host, env=env, output=None)
    label = "h0" if args.per_host == 1 else "h0.0"
    for line in res.output(label).splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    raise RuntimeError(f"benchmark run failed (exit {res.worst}):\n{res.describe()[-6000:]}")


def ring_bound_s(n: int, nbytes: int, rate: str) -> float | None:
    if rate == "none":
        return None
    return 2 * (n - 1) / n * nbytes * 8 / (parse_rate(rate) * GOODPUT)


def print_table(result: dict[str, Any], args: argparse.Namespace) -> None:
    n = result["n"]
    print(f"{args.hosts} hosts x {args.per_host} ranks, rate {args.rate}, median of {args.reps} "
          "(min..max)")
    print(f"{'size':>7} {'algo':>6} {'gloo ms':>22} {'tcp ms':>22} {'mixed ms':>22} "
          f"{'tcp/mixed':>9} {'ring bound':>10} {'cpu':>4}  plans")

    def fmt(e: dict[str, Any]) -> str:
        return f"{e['median_s'] * 1e3:.2f} ({e['min_s'] * 1e3:.2f}..{e['max_s'] * 1e3:.2f})"

    for row in result["rows"]:
        bound = ring_bound_s(n, row["bytes"], args.rate)
        b = row["bytes"]
        size = f"{b >> 20}MiB" if b >= 1 << 20 else f"{b >> 10}KiB"
        for a in args.algos:
            tcp, mixed = row[f"stragg:tcp:{a}"], row[f"stragg:mixed:{a}"]
            print(f"{size:>7} {a:>6} {fmt(row['gloo']):>22} {fmt(tcp):>22} "
                  f"{fmt(mixed):>22} {tcp['median_s'] / mixed['median_s']:>9.2f} "
                  f"{'-' if bound is None else f'{bound * 1e3:.1f}':>10} "
                  f"{row['cpu_busy'] * 100:>3.0f}%  {tcp['plan']} / {mixed['plan']} "
                  f"({tcp['transport']}, {mixed['transport']})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=2, help="emulated hosts (default 2)")
    p.add_argument("--per-host", type=int, default=2, help="ranks per host (default 2)")
    p.add_argument("--rate", default="1gbit", help="per-host link rate (tc units, or none)")
    p.add_argument("--sizes", default="16MiB", help="comma list of sizes (KiB/MiB)")
    p.add_argument("--algos", default="auto,ring", help="comma list of STRAGG_ALGO values")
    p.add_argument("--reps", type=int, default=5, help="measured repetitions per point")
    p.add_argument("--timeout", type=float, default=120.0, help="collective timeout, seconds")
    p.add_argument("--json", action="store_true", help="print the raw result as JSON")
    args = p.parse_args(argv)
    args.sizes = [_core.parse_size(x, "--sizes") for x in args.sizes.split(",")]
    args.algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    result = run(args)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
