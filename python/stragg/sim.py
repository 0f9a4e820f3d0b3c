"""Cost model / simulator for schedules (torch-free).

    >>> from stragg import schedule, sim
    >>> s = schedule.build("stragglar", 8)
    >>> r = sim.simulate(s, nbytes=2**30, alpha=3e-6, beta=1/450e9, straggler_delay=5e-3)
    >>> r.time

Model (csrc/core/simulator.h): alpha-beta per round, links to/from a rank with slowdown l cost
l*beta per byte, per-rank arrival times, lockstep (the papers' model) or dataflow execution, and
an optional ring topology with per-hop delay, congestion and circuit reconfiguration.

CLI::

    python -m stragg.sim ALGO -n N --bytes B --alpha A --beta BETA [--delay D] [--slowdown R=L] [--json]
    python -m stragg.sim ring rhd stragglar -n 8,16 --bytes 1GiB --bandwidth 450e9 --delay 5e-3
    python -m stragg.sim --table stragglar [--json]     # StragglAR paper's scaling table

``--json`` prints one object per (ALGO, N) with (at least) "algo", "n" and "time_seconds" (a list
of them when several algorithms or n are given).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from stragg._core_loader import load_core
from stragg.schedule import (
    Schedule,
    ScheduleError,
    build,
    cli_build,
    parse_n,
    parse_params,
    parse_slowdown,
)

_core = load_core()
closed_form = _core.closed_form


@dataclass
class SimResult:
    time: float
    pre_arrival_time: float
    rounds: int
    max_bytes_sent: float
    rank_finish: list[float] = field(default_factory=list)
    round_end: list[float] = field(default_factory=list)


def simulate(
    schedule: Schedule | Any,
    nbytes: float,
    alpha: float,
    beta: float,
    *,
    arrival: Sequence[float] | None = None,
    straggler_delay: float | None = None,
    straggler: int | None = None,
    slowdown: Sequence[float] | None = None,
    mode: str = "lockstep",
    ring_topology: bool = False,
    hop_delay: float = 0.0,
    reconfig_delay: float = 0.0,
    reconfigure: Sequence[bool] | None = None,
    host_of: Sequence[int] | None = None,
    local_alpha: float = 0.0,
    local_beta: float = 0.0,
) -> SimResult:
    """Completion time of ``schedule`` for a buffer of ``nbytes`` bytes.

    ``straggler_delay`` delays the schedule's straggler (or ``straggler``) by that much; ``arrival``
    gives every rank's arrival time explicitly. ``slowdown`` overrides the schedule's per-rank
    link slowdown factors. ``host_of`` (every rank's host) switches to the two-level model: the
    ranks of a host share its NIC (``alpha``, ``beta``), host mates talk at ``local_alpha`` and
    ``local_beta`` (lockstep only).
    """
    core = schedule.core if isinstance(schedule, Schedule) else schedule
    n = core.n
    arr = list(arrival) if arrival is not None else []
    if straggler_delay is not None:
        who = (
            straggler
            if straggler is not None
            else (core.stragglers[0] if core.stragglers else None)
        )
        if who is None:
            raise ValueError(
                "straggler_delay needs a straggler: the schedule has none, pass straggler="
            )
        if not arr:
            arr = [0.0] * n
        arr[who] += straggler_delay
    d = _core.simulate(
        core,
        float(nbytes),
        float(alpha),
        float(beta),
        arr,
        list(slowdown) if slowdown is not None else [],
        mode,
        ring_topology,
        float(hop_delay),
        float(reconfig_delay),
        list(reconfigure) if reconfigure is not None else [],
        [int(h) for h in host_of] if host_of is not None else [],
        float(local_alpha),
        float(local_beta),
    )
    return SimResult(
        time=d["time"],
        pre_arrival_time=d["pre_arrival_time"],
        rounds=d["rounds"],
        max_bytes_sent=d["max_bytes_sent"],
        rank_finish=list(d["rank_finish"]),
        round_end=list(d["round_end"]),
    )


def parse_bytes(text: str) -> int:
    """A size as every stragg setting takes it (one parser, csrc/plan/settings.cc): an integer
    with B, KiB/MiB/GiB (powers of 2) or KB/MB/GB (powers of 10); bare K/M/G are ambiguous."""
    try:
        return int(_core.parse_size(text, "size"))
    except Exception as exc:  # stragg's SettingsError
        raise argparse.ArgumentTypeError(str(exc).removeprefix("stragg: ")) from exc


def _parse_slowdown(text: str) -> tuple[int | None, float]:
    """ "R=L", or a bare "L" for the straggler's link (older form)."""
    if "=" in text:
        return parse_slowdown(text)
    try:
        return None, float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--slowdown expects RANK=FACTOR (e.g. 3=1.5), got {text!r}"
        ) from None


PAPER_TABLE_N = "4,8,16,32,64,128,256"


def stragglar_table(
    ns: Sequence[int], nbytes: float = 2.0**30, alpha: float = 3e-6, beta: float = 1 / 450e9
) -> list[dict[str, Any]]:
    """The StragglAR paper's scaling table (§3.2 / Table 1 / App. B), from simulated schedules.

    Times are measured from the straggler's arrival: Ring and RHD cannot start before it, so they
    pay their whole allreduce; StragglAR *ideal* has a delay long enough to hide the pre-arrival
    reduce-scatter (only the n + log2 n - 2 post-arrival rounds remain), StragglAR *worst* has no
    delay (reduce-scatter and post-arrival rounds serialised, 2(n-2) + log2 n rounds).
    """
    rows = []
    for n in ns:
        s = build("stragglar", n)
        worst = simulate(s, nbytes, alpha, beta, straggler_delay=0.0)
        hide = worst.pre_arrival_time  # delay that exactly hides the reduce-scatter
        ideal = simulate(s, nbytes, alpha, beta, straggler_delay=hide).time - hide
        ring = simulate(build("ring", n), nbytes, alpha, beta).time
        rhd = simulate(build("rhd", n), nbytes, alpha, beta).time
        rows.append(
            {
                "n": n,
                "ring_seconds": ring,
                "rhd_seconds": rhd,
                "stragglar_ideal_seconds": ideal,
                "stragglar_worst_seconds": worst.time,
                "stragglar_rounds": s.num_rounds,
                "stragglar_post_arrival_rounds": s.num_post_arrival_rounds,
                "speedup_ideal_vs_ring": ring / ideal,
                "speedup_ideal_vs_best": min(ring, rhd) / ideal,
            }
        )
    return rows


def _print_table(args: argparse.Namespace, beta: float) -> int:
    if args.algo:
        print("error: --table takes no ALGO", file=sys.stderr)
        return 2
    ns = parse_n(args.n if args.n is not None else PAPER_TABLE_N)
    rows = stragglar_table(ns, args.nbytes, args.alpha, beta)
    if args.json:
        doc = {
            "table": "stragglar",
            "bytes": args.nbytes,
            "alpha": args.alpha,
            "beta": beta,
            "time_unit": "seconds after the straggler arrives",
            "rows": rows,
        }
        print(json.dumps(doc, indent=2))
        return 0
    print(
        f"StragglAR scaling: {args.nbytes:.0f} bytes, alpha = {args.alpha * 1e6:g} us, "
        f"bandwidth = {1 / beta / 1e9:g} GB/s; ms after the straggler arrives"
    )
    print(
        f"{'n':>5} {'Ring':>10} {'RHD':>10} {'StragglAR ideal':>16} {'StragglAR worst':>16} "
        f"{'Ring/ideal':>11}"
    )
    for r in rows:
        print(
            f"{r['n']:>5} {r['ring_seconds'] * 1e3:>10.3f} {r['rhd_seconds'] * 1e3:>10.3f} "
            f"{r['stragglar_ideal_seconds'] * 1e3:>16.3f} "
            f"{r['stragglar_worst_seconds'] * 1e3:>16.3f} {r['speedup_ideal_vs_ring']:>10.2f}x"
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m stragg.sim",
        description="Predicted allreduce time of schedules (alpha-beta cost model).",
    )
    p.add_argument(
        "algo", nargs="*", metavar="ALGO", help="algorithm name(s) (python -m stragg.schedule list)"
    )
    p.add_argument(
        "-n", "--n", default=None, help='ranks: "8", "2..64", "8,16,32" (default 8; table: 4..256)'
    )
    p.add_argument(
        "--bytes",
        "--nbytes",
        dest="nbytes",
        type=parse_bytes,
        default=parse_bytes("1GiB"),
        metavar="B",
        help="buffer size: 1073741824, 64MiB, 1GiB (default 1GiB)",
    )
    p.add_argument("--alpha", type=float, default=3e-6, help="seconds per round (default 3e-6)")
    bw = p.add_mutually_exclusive_group()
    bw.add_argument("--beta", type=float, default=None, help="seconds per byte (default 1/450e9)")
    bw.add_argument("--bandwidth", type=float, default=None, help="bytes/s per link (beta = 1/bw)")
    p.add_argument("--delay", type=float, default=0.0, metavar="D", help="straggler delay (s)")
    p.add_argument("--straggler", type=int, default=None, help="straggler rank (default n-1)")
    p.add_argument(
        "--slowdown",
        type=_parse_slowdown,
        action="append",
        default=[],
        metavar="R=L",
        help="rank R's link is L times slower (repeatable; a bare L means the straggler's)",
    )
    p.add_argument("--segments", type=int, default=None, metavar="K", help="segments (OptCC)")
    p.add_argument("--mode", choices=["lockstep", "dataflow"], default="lockstep")
    p.add_argument("--ring-topology", action="store_true")
    p.add_argument("--hop-delay", type=float, default=0.0)
    p.add_argument("--reconfig-delay", type=float, default=0.0)
    p.add_argument("--param", action="append", default=[], help="generator parameter key=value")
    p.add_argument(
        "--table",
        choices=["stragglar"],
        default=None,
        help="print the StragglAR paper's scaling table (Ring vs RHD vs StragglAR ideal/worst)",
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.beta is not None:
        beta = args.beta
    elif args.bandwidth is not None:
        beta = 1.0 / args.bandwidth
    else:
        beta = 1.0 / 450e9
    try:
        if args.table:
            return _print_table(args, beta)
        if not args.algo:
            p.error("give an ALGO (or --table stragglar)")
        rows = _simulate_rows(args, beta)
    except ScheduleError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows[0] if len(rows) == 1 else rows, indent=2))
        return 0
    print(
        f"{'algo':<14} {'n':>5} {'rounds':>7} {'time (ms)':>12} {'after arrival':>14} "
        f"{'algbw GB/s':>11}"
    )
    for r in rows:
        print(
            f"{r['algo']:<14} {r['n']:>5} {r['rounds']:>7} {r['time_seconds'] * 1e3:>12.4f} "
            f"{r['after_arrival_seconds'] * 1e3:>14.4f} {r['algbw_GBps'] or 0:>11.2f}"
        )
    return 0


def _simulate_rows(args: argparse.Namespace, beta: float) -> list[dict[str, Any]]:
    extra = parse_params(args.param)
    rows: list[dict[str, Any]] = []
    for n in parse_n(args.n if args.n is not None else "8"):
        straggler = args.straggler if args.straggler is not None else n - 1
        slow = [(straggler if r is None else r, f) for r, f in args.slowdown]
        for algo in args.algo:
            params = dict(extra)
            who: int | None = None
            if algo in ("stragglar", "bcast", "stragglar_direct") or (algo == "optcc" and not slow):
                if "stragglers" not in params:
                    who = straggler
            elif algo == "optcc":
                who = args.straggler
            if algo == "short_circuit":
                params.setdefault("nbytes", args.nbytes)
                params.setdefault("alpha", args.alpha)
                params.setdefault("beta", beta)
                params.setdefault("hop_delay", args.hop_delay)
                params.setdefault("reconfig_delay", args.reconfig_delay)
            s = cli_build(
                algo, n, straggler=who, slowdown=slow, segments=args.segments, params=params
            )
            arrival = [0.0] * n
            arrival[straggler] = args.delay
            r = simulate(
                s,
                args.nbytes,
                args.alpha,
                beta,
                arrival=arrival,
                mode=args.mode,
                ring_topology=args.ring_topology,
                hop_delay=args.hop_delay,
                reconfig_delay=args.reconfig_delay,
            )
            rows.append(
                {
                    "algo": algo,
                    "n": n,
                    "bytes": args.nbytes,
                    "alpha": args.alpha,
                    "beta": beta,
                    "delay": args.delay,
                    "straggler": straggler,
                    "rounds": r.rounds,
                    "time_seconds": r.time,
                    "after_arrival_seconds": r.time - args.delay,
                    "pre_arrival_seconds": r.pre_arrival_time,
                    "algbw_GBps": args.nbytes / r.time / 1e9 if r.time > 0 else None,
                }
            )
    return rows


__all__ = ["SimResult", "asdict", "closed_form", "main", "simulate", "stragglar_table"]

if __name__ == "__main__":
    sys.exit(main())
