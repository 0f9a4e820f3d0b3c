"""all_reduce on a degraded network: stragg (Ring, auto, OptCC) vs Gloo on an emulated cluster.

    sudo python benchmarks/degraded.py --hosts 4 --slowdowns 1.14,1.33,2,3 --sizes 16MiB
    python benchmarks/degraded.py --hosts 4,5,8 --json > degraded.json --plot degraded.png
    python benchmarks/degraded.py --from-json a.json,b.json --plot degraded.png   # no run

For each host count p, one stragg.emucluster cluster (p network namespaces on a bridge, every
host link shaped to --rate both ways with tc htb) runs benchmarks/_degraded_worker.py on every
host: first with all links healthy (T0 = Gloo there), then with host p-1's link at rate/l for
each l (re-shaped in place). Columns per (p, l, size), median of --reps interleaved repetitions
(spread = (max - min) / median and iqr = interquartile range / median in --json):

  gloo        Gloo's all_reduce (a ring) on the degraded network
  ring        stragg's Ring (STRAGG_ALGO=ring)
  auto        stragg's default (STRAGG_ALGO=auto): the planner's choice from the probed links
  optcc       stragg's OptCC forced (STRAGG_ALGO=optcc; stragglers = the probed degraded ranks,
              k from the cost model)
  bound       OptCC's Theorem-1 lower bound max(2l(p-1)/(l(p-2)+2), l) * S * beta
  model       the alpha-beta model of each (core simulator, lockstep) on the nominal network

beta is the nominal per-host goodput (htb carries 1448 payload bytes per 1514-byte frame: 0.956 R,
measured by stragg.emucluster); alpha is the link probes' healthy median. The CPU busy share of the
2 cores during the timed loops shows that the network, not the CPUs, sets the pace.
Needs root (network namespaces).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

from stragg import _core, schedule, sim
from stragg.emucluster.net import parse_rate
from stragg.emucluster import EmuCluster

HERE = Path(__file__).resolve().parent
GOODPUT = 0.956  # payload share of htb's shaped rate (1448 of 1514 bytes per frame)
COLUMNS = ("gloo", "stragg:ring", "stragg:auto", "stragg:optcc")
SHORT = {"gloo": "gloo", "stragg:ring": "ring", "stragg:auto": "auto", "stragg:optcc": "optcc"}


def bound_s(p: int, l: float, nbytes: int, beta: float) -> float:
    return _core.closed_form.optcc_single_lower_bound(p, l) * nbytes * beta if l > 1 else (
        _core.closed_form.optcc_t0(p) * nbytes * beta
    )


def model_s(plan: str, p: int, l: float, nbytes: int, alpha: float, beta: float) -> float:
    """The alpha-beta model of `plan` ("ring", "optcc(3=2,k=16)", ...) with host p-1 at l."""
    slow = {p - 1: l} if l > 1 else {}
    m = re.fullmatch(r"(\w+)(?:\((.*)\))?", plan)
    algo, params = (m.group(1), m.group(2) or "") if m else (plan, "")
    kwargs: dict[str, Any] = {}
    if algo == "optcc":
        stragglers = {int(a): float(b) for a, b in re.findall(r"(\d+)=([\d.]+)", params)}
        k = re.search(r"k=(\d+)", params)
        kwargs = {"stragglers": sorted(stragglers) or [p - 1], "slowdowns": [
            l if r == p - 1 else 1.0 for r in (sorted(stragglers) or [p - 1])]}
        if k:
            kwargs["segments"] = int(k.group(1))
    elif algo in ("stragglar", "bcast", "stragglar_direct"):
        st, _, k = params.partition(",k=")
        kwargs = {"straggler": int(st or p - 1)}
        if k:
            kwargs["segments"] = int(k)
    s = schedule.build(algo, p, **kwargs)
    slowdown = [1.0] * p
    for r, f in slow.items():
        slowdown[r] = f
    return sim.simulate(s, nbytes=nbytes, alpha=alpha, beta=beta, slowdown=slowdown).time


def run_point(c: EmuCluster, cfg: dict[str, Any], timeout: float) -> dict[str, Any]:
    env = {"BENCH_CONFIG": json.dumps(cfg)}
    res = c.run([sys.executable, str(HERE / "_degraded_worker.py")], timeout=timeout, env=env,
                output=None)
    out = res.output("h0")
    for line in out.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    raise RuntimeError(f"benchmark run failed (exit {res.worst}):\n{res.output('h0')[-4000:]}")


def collect(args: argparse.Namespace) -> list[dict[str, Any]]:
    rate_bit = parse_rate(args.rate)
    beta = 8.0 / (rate_bit * GOODPUT)
    rows: list[dict[str, Any]] = []
    cfg = {"sizes": args.sizes, "reps": args.reps, "backends": list(COLUMNS),
           "timeout_s": args.timeout}
    for p in args.hosts:
        with EmuCluster(hosts=p, rate=args.rate, name=f"bench{p}") as c:
            healthy = run_point(c, cfg, args.timeout * 4)
            t0 = {r["bytes"]: r["gloo"]["median_s"] for r in healthy["rows"]}
            for l in [1.0, *args.slowdowns]:
                if l > 1:
                    c.degrade(p - 1, l)
                point = healthy if l == 1 else run_point(c, cfg, args.timeout * 4)
                probe = point["probes"].get("stragg:auto", {})
                alpha = probe.get("alpha_s", 0.0)
                for r in point["rows"]:
                    rows.append(make_row(p, l, r, t0[r["bytes"]], probe, beta, alpha))
                    if not args.json:
                        print_row(rows[-1])
            if any(l > 1 for l in args.slowdowns):
                c.degrade(p - 1, 1.0)
    return rows


def make_row(p: int, l: float, r: dict[str, Any], t0: float, probe: dict[str, Any], beta: float,
             alpha: float) -> dict[str, Any]:
    nbytes = r["bytes"]
    row: dict[str, Any] = {
        "hosts": p, "l": l, "bytes": nbytes, "t0_s": t0, "cpu_busy": r["cpu_busy"],
        "bound_s": bound_s(p, l, nbytes, beta),
        "detected": probe.get("degraded", {}),
    }
    for col in COLUMNS:
        e = r[col]
        plan = e.get("plan", "ring")
        q1, _, q3 = statistics.quantiles(e["samples_s"], n=4) if len(e["samples_s"]) > 1 else (
            e["median_s"], 0, e["median_s"])
        row[SHORT[col]] = {
            "median_s": e["median_s"], "min_s": e["min_s"], "max_s": e["max_s"],
            "spread": (e["max_s"] - e["min_s"]) / e["median_s"], "iqr": (q3 - q1) / e["median_s"],
            "plan": plan,
            "model_s": model_s(plan, p, l, nbytes, alpha, beta),
            "per_t0": e["median_s"] / t0, "per_bound": e["median_s"] / row["bound_s"],
        }
        if e.get("predicted_s"):
            row[SHORT[col]]["planner_predicted_s"] = e["predicted_s"]
        for key in ("plans", "queued_s", "agreement_s", "run_s"):  # stragg's call records
            if key in e:
                row[SHORT[col]][key] = e[key]
    row["auto_vs_gloo"] = row["gloo"]["median_s"] / row["auto"]["median_s"]
    row["auto_vs_ring"] = row["auto"]["median_s"] / row["ring"]["median_s"]
    return row


HEADER = (f"{'p':>2} {'l':>5} {'size':>6} {'T0':>6} {'gloo':>6} {'ring':>6} {'auto':>6} "
          f"{'optcc':>6} {'bound':>6} {'auto/bnd':>8} {'gloo/auto':>9} {'cpu':>4}  auto plan "
          "[auto spread, auto iqr; ring spread]  detected")


def print_row(r: dict[str, Any]) -> None:
    if not getattr(print_row, "header", False):
        print(HEADER)
        print_row.header = True  # type: ignore[attr-defined]
    size = f"{r['bytes'] >> 20}MiB"
    det = ",".join(f"{k}={v:.2f}" for k, v in r["detected"].items()) or "-"
    print(f"{r['hosts']:>2} {r['l']:>5.2f} {size:>6} {r['t0_s']:>6.3f} {r['gloo']['median_s']:>6.3f} "
          f"{r['ring']['median_s']:>6.3f} {r['auto']['median_s']:>6.3f} "
          f"{r['optcc']['median_s']:>6.3f} {r['bound_s']:>6.3f} {r['auto']['per_bound']:>8.3f} "
          f"{r['auto_vs_gloo']:>9.3f} {r['cpu_busy'] * 100:>3.0f}%  {r['auto']['plan']} "
          f"[{r['auto']['spread'] * 100:.0f}%, iqr {r['auto']['iqr'] * 100:.0f}%; ring "
          f"{r['ring']['spread'] * 100:.0f}%]  {det}", flush=True)


def plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hosts = sorted({r["hosts"] for r in rows})
    size = max(r["bytes"] for r in rows)
    fig, axes = plt.subplots(1, len(hosts), figsize=(5 * len(hosts), 4), squeeze=False)
    for ax, p in zip(axes[0], hosts):
        pts = sorted((r for r in rows if r["hosts"] == p and r["bytes"] == size), key=lambda r: r["l"])
        ls = [r["l"] for r in pts]
        for key, style in (("gloo", "o-"), ("ring", "s-"), ("auto", "^-"), ("optcc", "v--")):
            med = [r[key]["median_s"] for r in pts]
            lo = [r[key]["median_s"] - r[key]["min_s"] for r in pts]
            hi = [r[key]["max_s"] - r[key]["median_s"] for r in pts]
            ax.errorbar(ls, med, yerr=[lo, hi], fmt=style, capsize=3, label=key)
        ax.plot(ls, [r["bound_s"] for r in pts], "k:", label="Theorem-1 bound")
        ax.set_title(f"{p} hosts, {size >> 20} MiB float32")
        ax.set_xlabel("slowdown l of host p-1")
        ax.set_ylabel("all_reduce time (s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def summary(rows: list[dict[str, Any]]) -> None:
    deg = [r for r in rows if r["l"] > 1]
    if not deg:
        return
    print("\n# auto/bound: median", f"{statistics.median(r['auto']['per_bound'] for r in deg):.3f}",
          "max", f"{max(r['auto']['per_bound'] for r in deg):.3f};",
          "gloo/auto: min", f"{min(r['auto_vs_gloo'] for r in deg):.3f};",
          "auto/ring: max", f"{max(r['auto_vs_ring'] for r in rows):.3f};",
          "cpu busy: max", f"{max(r['cpu_busy'] for r in rows) * 100:.0f}%")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", default="4", help="comma list of host counts (default 4)")
    p.add_argument("--slowdowns", default="1.14,1.33,2,3", help="comma list of l > 1")
    p.add_argument("--sizes", default="16MiB", help="comma list of sizes (KiB/MiB)")
    p.add_argument("--rate", default="300mbit", help="per-host link rate (tc units)")
    p.add_argument("--reps", type=int, default=5, help="measured repetitions per point")
    p.add_argument("--timeout", type=float, default=120.0, help="collective timeout, seconds")
    p.add_argument("--json", action="store_true", help="print one JSON list of rows, nothing else")
    p.add_argument("--plot", default="", help="write a PNG: time vs l per algorithm")
    p.add_argument("--from-json", default="", metavar="A.json[,B.json]",
                   help="no run: table, summary and --plot from earlier --json outputs (joined)")
    args = p.parse_args(argv)
    if args.from_json:
        rows = [r for f in args.from_json.split(",") for r in json.loads(Path(f).read_text())]
        for r in rows:
            print_row(r)
        summary(rows)
        if args.plot:
            plot(rows, args.plot)
        return 0
    args.hosts = [int(x) for x in args.hosts.split(",")]
    args.slowdowns = [float(x) for x in args.slowdowns.split(",") if x.strip()]
    args.sizes = [_core.parse_size(x, "--sizes") for x in args.sizes.split(",")]
    rows = collect(args)
    if args.json:
        print(json.dumps(rows))
    else:
        summary(rows)
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
