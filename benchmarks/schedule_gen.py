"""Benchmark: schedule generation speed (and verification) per algorithm and n.

    python benchmarks/schedule_gen.py [--n 8,16,64,256,1024] [--algos stragglar,optcc] [--json]

Prints a table (or JSON rows): generation time (best of --repeat), rounds, StragglAR's lower
bound and the verifier's time. Torch-free: needs only the stragg._core module.

StragglAR generation on the 2-core dev box: n = 64 0.3 ms, 96 3 ms, 200 19 ms, 250/255 27 ms,
256 10 ms, 1024 0.47 s; worst non-power-of-2 n <= 256 ~80 ms (n = 251). Non-power-of-2 n > 256
have no stored circulant design and fall back to the slow heuristic (seconds to minutes).
"""

from __future__ import annotations

import argparse
import json
import time

from stragg import schedule


def bench(algo: str, n: int, repeat: int, verify: bool) -> dict[str, object]:
    best = float("inf")
    s = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        s = schedule.build(algo, n)
        best = min(best, time.perf_counter() - t0)
    assert s is not None
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", default="8,16,63,64,96,200,250,255,256,1024")
    p.add_argument("--algos", default="ring,rhd,direct,stragglar,bcast,optcc")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--verify-max-n", type=int, default=256)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows = [
        bench(a, n, args.repeat, n <= args.verify_max_n)
        for a in args.algos.split(",")
        for n in schedule.parse_n(args.n)
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(
        f"{'algo':<10} {'n':>5} {'rounds':>7} {'post':>6} {'bound':>6} {'gen ms':>9} {'verify ms':>10}"
    )
    for r in rows:
        vm = f"{r['verify_ms']:.1f}" if "verify_ms" in r else "-"
        print(
            f"{r['algo']:<10} {r['n']:>5} {r['rounds']:>7} {r['post_arrival_rounds']:>6} "
            f"{r.get('lower_bound', ''):>6} {r['generate_ms']:>9.2f} {vm:>10}"
        )


if __name__ == "__main__":
    main()
