"""Benchmark: schedule generation speed (and verification) per algorithm and n.

    python benchmarks/schedule_gen.py [--n 8,16,64,256,1024] [--algos stragglar,optcc] [--json]
        [--even-max 256] [--odd-max 65] [--no-targets] [--no-rows] [--no-even]
        [--appendix-e csrc/core/tools/stragglar_appendix_e.json] [--plot docs/schedule_gaps.png]

Prints three tables (or, with --json, one object {"targets", "rows", "even_n", "even_summary"}):

1. the issue's generation-time targets, best of --repeat: StragglAR n = 256 (<= 50 ms),
   n = 1024 (<= 2 s), OptCC n = 1024 with k = 64 segments (<= 10 ms);
2. per algorithm and n: generation time, rounds, post-arrival rounds, StragglAR's lower bound and
   the verifier's time;
3. StragglAR for every even n = 4 ... --even-max and odd n = 3 ... --odd-max: rounds (total and
   post-arrival) against the post-arrival lower bound n - 2 + ceil(log2 n), the gap, the
   construction that built it (stragg.schedule.stragglar_construction) and the generation time;
   with --appendix-e, also the round count of the paper's App. E heuristic from the offline
   search tool's results (csrc/core/tools/stragglar_search.py appendix-e), which is not part of
   the library. --plot writes a PNG of the gap against n (matplotlib).

Torch-free in spirit (needs only stragg._core; importing the stragg package loads torch).
Generation is timed around stragg.schedule.build (the C++ generator plus the hand-over to Python);
the previous schedule is freed before each timed call. OptCC is built in the IR's compact form
(pattern steps, csrc/core/ir.h): one header per step, transfers generated on demand; "compact" in
the JSON target rows says whether a schedule came out that way.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from typing import Any

from stragg import schedule

# (label, algo, n, params, limit in seconds) from the "Performance" section.
TARGETS: list[tuple[str, str, int, dict[str, Any], float]] = [
    ("StragglAR n=256", "stragglar", 256, {}, 0.050),
    ("StragglAR n=1024", "stragglar", 1024, {}, 2.0),
    ("OptCC n=1024 k=64", "optcc", 1024, {"segments": 64}, 0.010),
]


def time_build(algo: str, n: int, params: dict[str, Any], repeat: int) -> tuple[float, Any]:
    best = float("inf")
    s = None
    for _ in range(repeat):
        s = None  # free the previous schedule outside the timed region
        gc.collect()
        t0 = time.perf_counter()
        s = schedule.build(algo, n, **params)
        best = min(best, time.perf_counter() - t0)
    assert s is not None
    return best, s


def bench(algo: str, n: int, repeat: int, verify: bool) -> dict[str, object]:
    best, s = time_build(algo, n, {}, repeat)
    row: dict[str, object] = {
        "algo": algo,
        "n": n,
        "rounds": s.num_rounds,
        "post_arrival_rounds": s.num_post_arrival_rounds,
        "generate_ms": best * 1e3,
    }
    if algo == "stragglar":
        row["lower_bound"] = schedule.stragglar_round_lower_bound(n)
    if verify:
        t0 = time.perf_counter()
        row["verified"] = bool(s.verify())
        row["verify_ms"] = (time.perf_counter() - t0) * 1e3
    return row


def targets(repeat: int) -> list[dict[str, object]]:
    rows = []
    for label, algo, n, params, limit in TARGETS:
        best, s = time_build(algo, n, params, repeat)
        rows.append(
            {
                "target": label,
                "algo": algo,
                "n": n,
                "params": params,
                "rounds": s.num_rounds,
                "steps": s.num_steps,
                "compact": bool(getattr(s.core, "compact", False)),
                "generation_seconds": best,
                "limit_seconds": limit,
                "ok": best <= limit,
            }
        )
        del s
    return rows


def even_table(max_n: int, odd_max: int, appendix_e: dict[str, Any]) -> list[dict[str, object]]:
    rows = []
    ns = sorted(set(range(4, max_n + 1, 2)) | set(range(3, odd_max + 1, 2)))
    for n in ns:
        gc.collect()
        t0 = time.perf_counter()
        s = schedule.build("stragglar", n)
        gen = time.perf_counter() - t0
        lb = schedule.stragglar_round_lower_bound(n)
        post = s.num_post_arrival_rounds
        kind = "pow2" if n & (n - 1) == 0 else ("even" if n % 2 == 0 else "odd")
        row: dict[str, object] = {
            "n": n,
            "kind": kind,
            "rounds": s.num_rounds,
            "pre_arrival_rounds": s.num_rounds - post,
            "post_arrival_rounds": post,
            "lower_bound": lb,
            "gap": post - lb,
            "construction": schedule.stragglar_construction(n),
            "generate_ms": gen * 1e3,
        }
        a = appendix_e.get(str(n))
        if a and a.get("ok"):
            row["appendix_e_rounds"] = a["rounds"]
        rows.append(row)
        del s
    return rows


def plot_gaps(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.6))
    for kind, marker, label in (("even", "o", "even n"), ("odd", "s", "odd n"),
                                ("pow2", "D", "power of 2 (Algorithm 1)")):
        pts = [(r["n"], r["gap"]) for r in rows if r["kind"] == kind]
        if pts:
            ax.plot(*zip(*pts), marker, ms=3.5, ls="none", label=f"stragg: {label}")
    app = [(r["n"], r["appendix_e_rounds"] - r["lower_bound"]) for r in rows
           if "appendix_e_rounds" in r]
    if app:
        ax.plot(*zip(*app), "x", ms=3.5, color="grey", label="paper's App. E heuristic")
    ax.set_xlabel("n (ranks)")
    ax.set_ylabel("rounds above lower bound")
    ax.set_title("StragglAR post-arrival rounds minus n - 2 + ceil(log2 n)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def even_summary(rows: list[dict[str, Any]]) -> dict[str, object]:
    gaps: dict[int, list[int]] = {}
    for r in rows:
        gaps.setdefault(int(r["gap"]), []).append(int(r["n"]))
    non_pow2 = [r for r in rows if r["kind"] == "even"]
    app = [r for r in rows if "appendix_e_rounds" in r]
    return {
        "count": len(rows),
        "n_by_gap": {str(g): ns for g, ns in sorted(gaps.items())},
        "max_gap": max(gaps) if gaps else None,
        "pow2_all_exact": all(r["gap"] == 0 for r in rows if r["kind"] == "pow2"),
        "non_pow2_at_bound": sum(1 for r in non_pow2 if r["gap"] == 0),
        "non_pow2_bound_plus_1": sum(1 for r in non_pow2 if r["gap"] == 1),
        "non_pow2_bound_plus_2": sum(1 for r in non_pow2 if r["gap"] == 2),
        "max_generate_ms": max((float(r["generate_ms"]) for r in rows), default=0.0),
        "appendix_e_compared": len(app),
        "appendix_e_fewer_rounds_than_ours": [
            r["n"] for r in app if int(r["appendix_e_rounds"]) < int(r["post_arrival_rounds"])
        ],
    }


def _ranges(ns: list[int], table: list[int]) -> str:
    """Runs of n that are consecutive rows of the table (which skips odd n above --odd-max)."""
    pos = {n: i for i, n in enumerate(table)}
    out, i = [], 0
    while i < len(ns):
        j = i
        while j + 1 < len(ns) and pos[ns[j + 1]] == pos[ns[j]] + 1:
            j += 1
        out.append(str(ns[i]) if i == j else f"{ns[i]}-{ns[j]}")
        i = j + 1
    return ", ".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", default="8,16,63,64,96,200,250,255,256,1024")
    p.add_argument("--algos", default="ring,rhd,direct,stragglar,bcast,optcc")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--verify-max-n", type=int, default=256)
    p.add_argument("--even-max", type=int, default=256, help="even-n table: n = 4 ... this")
    p.add_argument("--odd-max", type=int, default=65, help="and odd n = 3 ... this")
    p.add_argument("--appendix-e", help="App. E results (JSON from stragglar_search.py)")
    p.add_argument("--plot", help="write a PNG of the gap against n here")
    p.add_argument("--no-targets", action="store_true", help="skip the issue's timing targets")
    p.add_argument("--no-rows", action="store_true", help="skip the per-algorithm table")
    p.add_argument("--no-even", action="store_true", help="skip the even-n rounds table")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    tgt = [] if args.no_targets else targets(args.repeat)
    rows = (
        []
        if args.no_rows
        else [
            bench(a, n, args.repeat, n <= args.verify_max_n)
            for a in args.algos.split(",")
            for n in schedule.parse_n(args.n)
        ]
    )
    appendix_e: dict[str, Any] = {}
    if args.appendix_e:
        with open(args.appendix_e) as f:
            appendix_e = json.load(f)
    even = [] if args.no_even else even_table(args.even_max, args.odd_max, appendix_e)
    summary = even_summary(even) if even else {}
    if even and args.plot:
        plot_gaps(even, args.plot)
    if args.json:
        doc = {"targets": tgt, "rows": rows, "even_n": even, "even_summary": summary}
        print(json.dumps(doc, indent=2))
        return

    if tgt:
        print(f"Generation-time targets (best of {args.repeat}):")
        print(f"{'target':<20} {'rounds':>7} {'steps':>8} {'gen ms':>10} {'limit ms':>9}  ok")
        for r in tgt:
            print(
                f"{r['target']:<20} {r['rounds']:>7} {r['steps']:>8} "
                f"{r['generation_seconds'] * 1e3:>10.2f} {r['limit_seconds'] * 1e3:>9.0f}  "
                f"{'yes' if r['ok'] else 'NO'}"
            )
        print()
    if rows:
        print(
            f"{'algo':<10} {'n':>5} {'rounds':>7} {'post':>6} {'bound':>6} {'gen ms':>9} "
            f"{'verify ms':>10}"
        )
        for r in rows:
            vm = f"{r['verify_ms']:.1f}" if "verify_ms" in r else "-"
            print(
                f"{r['algo']:<10} {r['n']:>5} {r['rounds']:>7} {r['post_arrival_rounds']:>6} "
                f"{r.get('lower_bound', ''):>6} {r['generate_ms']:>9.2f} {vm:>10}"
            )
        print()
    if even:
        print(
            "StragglAR, every even n and small odd n (post-arrival rounds vs the lower bound "
            "n - 2 + ceil(log2 n)):"
        )
        print(
            f"{'n':>5} {'kind':<5} {'rounds':>7} {'post':>6} {'bound':>6} {'gap':>4} "
            f"{'App.E':>6} {'construction':<24} {'gen ms':>8}"
        )
        for r in even:
            print(
                f"{r['n']:>5} {r['kind']:<5} {r['rounds']:>7} {r['post_arrival_rounds']:>6} "
                f"{r['lower_bound']:>6} {r['gap']:>4} {r.get('appendix_e_rounds', '-'):>6} "
                f"{r['construction']:<24} {r['generate_ms']:>8.2f}"
            )
        print(
            f"summary: {summary['count']} n; powers of two exact: "
            f"{summary['pow2_all_exact']}; max gap {summary['max_gap']}; "
            f"max generation {summary['max_generate_ms']:.1f} ms"
        )
        for g, ns in summary["n_by_gap"].items():
            print(f"  gap {g}: n = {_ranges(ns, [int(r['n']) for r in even])}")
        if summary["appendix_e_compared"]:
            worse = summary["appendix_e_fewer_rounds_than_ours"]
            print(
                f"  App. E heuristic compared at {summary['appendix_e_compared']} n; "
                f"fewer rounds than ours at: {worse if worse else 'none'}"
            )


if __name__ == "__main__":
    main()
