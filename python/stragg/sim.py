"""Cost model / simulator for schedules (torch-free).

    >>> from stragg import schedule, sim
    >>> s = schedule.build("stragglar", 8)
    >>> r = sim.simulate(s, nbytes=2**30, alpha=3e-6, beta=1/450e9, straggler_delay=5e-3)
    >>> r.time

Model (csrc/core/simulator.h): alpha-beta per round, links to/from a rank with slowdown l cost
l*beta per byte, per-rank arrival times, lockstep (the papers' model) or dataflow execution, and
an optional ring topology with per-hop delay, congestion and circuit reconfiguration.

CLI::

    python -m stragg.sim ring rhd direct stragglar bcast --n 8 --nbytes 1GiB \\
        --alpha 3e-6 --bandwidth 450e9 --delay 5e-3 [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from stragg._core_loader import load_core
from stragg.schedule import Schedule, ScheduleError, build, parse_n, parse_params

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
) -> SimResult:
    """Completion time of ``schedule`` for a buffer of ``nbytes`` bytes.

    ``straggler_delay`` delays the schedule's straggler (or ``straggler``) by that much; ``arrival``
    gives every rank's arrival time explicitly. ``slowdown`` overrides the schedule's per-rank
    link slowdown factors.
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
    )
    return SimResult(
        time=d["time"],
        pre_arrival_time=d["pre_arrival_time"],
        rounds=d["rounds"],
        max_bytes_sent=d["max_bytes_sent"],
        rank_finish=list(d["rank_finish"]),
        round_end=list(d["round_end"]),
    )


_UNITS = {
    "": 1,
    "b": 1,
    "k": 1e3,
    "kb": 1e3,
    "m": 1e6,
    "mb": 1e6,
    "g": 1e9,
    "gb": 1e9,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_bytes(text: str) -> float:
    m = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (e.g. 4096, 64MiB, 1GiB)")
    return float(m.group(1)) * _UNITS[m.group(2).lower()]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m stragg.sim", description="Cost schedules.")
    p.add_argument("algo", nargs="+", help="algorithm names (python -m stragg.schedule list)")
    p.add_argument("--n", default="8", help='ranks: "8", "2..64", "8,16,32"')
    p.add_argument("--nbytes", type=parse_bytes, default=parse_bytes("1GiB"))
    p.add_argument("--alpha", type=float, default=3e-6, help="seconds per round")
    p.add_argument("--bandwidth", type=float, default=450e9, help="bytes/s per link (beta = 1/bw)")
    p.add_argument("--delay", type=float, default=0.0, help="straggler delay (s)")
    p.add_argument("--straggler", type=int, default=None, help="straggler rank (default n-1)")
    p.add_argument("--slowdown", type=float, default=None, help="straggler link slowdown factor")
    p.add_argument("--mode", choices=["lockstep", "dataflow"], default="lockstep")
    p.add_argument("--ring-topology", action="store_true")
    p.add_argument("--hop-delay", type=float, default=0.0)
    p.add_argument("--reconfig-delay", type=float, default=0.0)
    p.add_argument("--param", action="append", default=[], help="generator parameter key=value")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    beta = 1.0 / args.bandwidth
    extra = parse_params(args.param)
    rows: list[dict[str, Any]] = []
    try:
        for n in parse_n(args.n):
            straggler = args.straggler if args.straggler is not None else n - 1
            for algo in args.algo:
                params = dict(extra)
                if algo in ("stragglar", "bcast") or (
                    algo == "optcc" and "stragglers" not in params
                ):
                    params.setdefault("straggler", straggler)
                if algo == "optcc" and args.slowdown is not None:
                    params.setdefault("slowdown", args.slowdown)
                s = build(algo, n, **params)
                slow = None
                if args.slowdown is not None and algo != "optcc":
                    slow = [1.0] * n
                    slow[straggler] = args.slowdown
                arrival = [0.0] * n
                arrival[straggler] = args.delay
                r = simulate(
                    s,
                    args.nbytes,
                    args.alpha,
                    beta,
                    arrival=arrival,
                    slowdown=slow,
                    mode=args.mode,
                    ring_topology=args.ring_topology,
                    hop_delay=args.hop_delay,
                    reconfig_delay=args.reconfig_delay,
                )
                rows.append(
                    {
                        "algo": algo,
                        "n": n,
                        "nbytes": args.nbytes,
                        "rounds": r.rounds,
                        "time_s": r.time,
                        "after_arrival_s": r.time - args.delay,
                        "algbw_GBps": args.nbytes / r.time / 1e9 if r.time > 0 else None,
                    }
                )
    except ScheduleError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"{'algo':<14} {'n':>5} {'rounds':>7} {'time (ms)':>12} {'after arrival':>14} {'algbw GB/s':>11}"
    )
    for r in rows:
        print(
            f"{r['algo']:<14} {r['n']:>5} {r['rounds']:>7} {r['time_s'] * 1e3:>12.4f} "
            f"{r['after_arrival_s'] * 1e3:>14.4f} {r['algbw_GBps'] or 0:>11.2f}"
        )
    return 0


__all__ = ["SimResult", "asdict", "closed_form", "main", "simulate"]

if __name__ == "__main__":
    sys.exit(main())
