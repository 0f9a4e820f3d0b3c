#!/usr/bin/env python3
"""Offline search for StragglAR schedules; keeps the best per n and writes stragglar_designs.inc.

For each n (powers of 2 are skipped: Algorithm 1 is exact) it runs every construction we have
through the C++ driver (csrc/core/tools/stragglar_tool.cc: what the library builds now, the
deadline matching heuristic, the circulant design with its greedy tail, the two-chain design, and
the paper's App. E heuristic), then CP-SAT models (stragglar_cpsat.py) for every round count from
the lower bound up to one below the best found, stopping at the first feasible one:

  1. the stored circulant design (its receive ages fixed) for all but the last K chunks, the last
     K chunks free (K = 2, 3, 4): small models, seconds at n = 254;
  2. a circulant design chosen by the solver, free rounds after the straggler's second-to-last
     exchange;
  3. the full model (n <= 46), which can also prove a round count infeasible (kept as the
     certificate in the database).

Every candidate is expanded and verified by the driver before it counts. The database
(stragglar_designs.json beside this file) keeps per n the best design in the stored form
(csrc/core/stragglar_stored.cc), every construction's round count and the CP-SAT statuses;
`emit` writes csrc/core/stragglar_designs.inc from it. Deterministic: fixed seeds, and CP-SAT's
result is checked, not trusted (a different solution on rerun is fine: any verified one is kept).

Needs: the driver (cmake -S . -B build/tools -DSTRAGG_CORE_TOOLS=ON -DSTRAGG_TORCH=OFF
-DSTRAGG_PYTHON=OFF && cmake --build build/tools --target stragglar_tool; LEMON from Debian's
liblemon-dev) and `pip install ortools`. Usage:

  python3 csrc/core/tools/stragglar_search.py search --ns 3-255 [--budget 60]
  python3 csrc/core/tools/stragglar_search.py appendix-e --ns 4-254   # fills the App. E cache
  python3 csrc/core/tools/stragglar_search.py emit > csrc/core/stragglar_designs.inc
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

DB = os.path.join(HERE, "stragglar_designs.json")
APPENDIX_E = os.path.join(HERE, "stragglar_appendix_e.json")  # App. E results (appendix-e)
DRIVER = os.path.join(HERE, "..", "..", "..", "build", "tools", "csrc", "core", "stragglar_tool")
AGE_CHARS = ".123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
CONSTRUCTIONS = ("library", "matching", "circulant_greedy", "two_chain")


def lower_bound(n: int) -> int:
    return n - 2 + math.ceil(math.log2(n))


def parse_ns(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return [n for n in out if n >= 3 and n & (n - 1)]


def appendix_e_restarts(n: int) -> int:
    return 8 if n <= 64 else (4 if n <= 128 else 2)


# ---------------------------------------------------------------- driver
def run_driver(driver: str, args: list[str], stdin: Optional[str] = None) -> list[dict]:
    out = subprocess.run([driver, *args], input=stdin, capture_output=True, text=True, check=True)
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def encode_tail(table: list[list[int]], t0: int) -> str:
    chars = []
    for i, row in enumerate(table):
        r = t0 + i
        for c in row:
            chars.append("." if c < 0 else AGE_CHARS[r - c])
    return "".join(chars)


def design_record(d: Any) -> dict:
    """CP-SAT Design -> stored form."""
    return {
        "construction": d.construction,
        "rounds": d.rounds,
        "max_age": max(d.beta) if d.beta else 0,
        "beta": "".join(AGE_CHARS[a] for a in d.beta),
        "tail_from": d.tail_from,
        "tail": encode_tail(d.tail, d.tail_from),
    }


def check_records(driver: str, n: int, records: list[dict]) -> list[dict]:
    lines = "".join(
        f"{n} {r['construction']} {r['max_age']} {r['beta'] or '-'} {r['tail_from']} "
        f"{r['tail'] or '-'}\n"
        for r in records
    )
    return run_driver(driver, ["check"], lines)


# ---------------------------------------------------------------- CP-SAT
def cpsat_attempts(n: int, rounds: int, base_beta: Optional[list[int]]):
    """(label, callable(time_limit) -> (status, Design|None)) in the order tried."""
    from stragglar_cpsat import solve_circulant_last_chunks, solve_circulant_tail, solve_full

    m, L = n - 1, math.ceil(math.log2(n))
    if base_beta:
        A = max(base_beta)
        for K in (2, 3, 4, 1):
            if m - K - 1 + A <= rounds - 1 and m - K >= 1:
                yield (f"last_chunks K={K}", lambda t, K=K: solve_circulant_last_chunks(
                    n, rounds, K, A, t, beta=base_beta))
    if m - 1 > L + 1:
        yield ("circulant_tail", lambda t: solve_circulant_tail(n, rounds, m - 1, L + 1, t))
    if n <= 46:
        yield ("full", lambda t: solve_full(n, rounds, t))


def cpsat_search(n: int, best_rounds: int, base_beta, driver: str, budget: float, log) -> dict:
    """Tries round counts LB .. best_rounds-1; returns {"design", "statuses"}."""
    statuses: dict[str, str] = {}
    for rounds in range(lower_bound(n), best_rounds):
        for label, solve in cpsat_attempts(n, rounds, base_beta):
            t = time.time()
            status, design = solve(budget)
            statuses[f"{rounds}:{label}"] = status
            log(f"  n={n} rounds={rounds} {label}: {status} ({time.time() - t:.1f}s)")
            if design is None:
                if status == "INFEASIBLE" and label == "full":
                    break  # exact: no schedule with this many rounds
                continue
            rec = design_record(design)
            res = check_records(driver, n, [rec])[0]
            if res["ok"] and res["rounds"] == rounds:
                return {"design": rec, "statuses": statuses}
            statuses[f"{rounds}:{label}"] = "REJECTED: " + res.get("error", "")
    return {"design": None, "statuses": statuses}


# ---------------------------------------------------------------- database
def load_db(path: str) -> dict:
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {}


def save_db(db: dict, path: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(dict(sorted(db.items(), key=lambda kv: int(kv[0]))), f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def stored_size(rec: dict) -> int:
    return len(rec.get("beta", "")) + len(rec.get("tail", ""))


def search_n(n: int, entry: dict, driver: str, budget: float, log) -> dict:
    results = entry.setdefault("results", {})
    candidates: list[dict] = []
    if entry.get("best"):
        candidates.append(entry["best"])
    for name in CONSTRUCTIONS:
        if name == "two_chain" and n < 8:
            continue
        out = run_driver(driver, ["construct", name, str(n)])[0]
        results[name] = out["rounds"] if out["ok"] else None
        if out["ok"] and name != "library":
            candidates.append({k: out[k] for k in ("construction", "rounds", "max_age", "beta",
                                                  "tail_from", "tail")})
    best_rounds = min(c["rounds"] for c in candidates)
    base = [AGE_CHARS.index(ch) for ch in entry.get("circulant_beta", "")]
    found = cpsat_search(n, best_rounds, base or None, driver, budget, log)
    entry["cpsat"] = found["statuses"]
    if found["design"]:
        results["cpsat"] = found["design"]["rounds"]
        candidates.append(found["design"])
    entry["best"] = min(candidates, key=lambda c: (c["rounds"], stored_size(c)))
    entry["lower_bound"] = lower_bound(n)
    return entry


def seed_circulant_betas(db: dict) -> None:
    """Takes the circulant designs (ILP, stragglar_designs.py's) from the current .inc once."""
    import re

    inc = open(os.path.join(HERE, "..", "stragglar_designs.inc")).read()
    for n, A, beta in re.findall(r'\{(\d+), "[a-z_0-9]+", (\d+), "([0-9a-zA-Z]+)"', inc):
        e = db.setdefault(n, {})
        e.setdefault("circulant_beta", beta)


def cmd_search(args) -> None:
    db = load_db(args.db)
    seed_circulant_betas(db)
    for n in parse_ns(args.ns):
        t = time.time()
        entry = search_n(n, db.setdefault(str(n), {}), args.driver, args.budget,
                         lambda s: print(s, file=sys.stderr, flush=True))
        b = entry["best"]
        print(f"n={n} LB={entry['lower_bound']} best={b['rounds']} ({b['construction']}) "
              f"results={entry['results']} {time.time() - t:.1f}s", flush=True)
        save_db(db, args.db)


def cmd_appendix_e(args) -> None:
    """Runs the App. E heuristic per n into its own file (slow at large n: run it beside search)."""
    for n in parse_ns(args.ns):
        t = time.time()
        out = run_driver(args.driver, ["construct", "appendix_e", str(n),
                                       str(appendix_e_restarts(n)), "1"])[0]
        print(f"n={n} appendix_e rounds={out.get('rounds')} ok={out['ok']} "
              f"{time.time() - t:.1f}s", flush=True)
        cache = load_db(args.appendix_e)
        cache[str(n)] = {k: out.get(k) for k in ("construction", "rounds", "ok", "error",
                                                 "max_age", "beta", "tail_from", "tail")}
        cache[str(n)]["restarts"] = appendix_e_restarts(n)
        strip_unneeded_tails(cache, load_db(args.db))
        save_db(cache, args.appendix_e)


def strip_unneeded_tails(cache: dict, db: dict) -> None:
    """Keeps App. E's schedule only where it has fewer rounds than the database's best."""
    for key, a in cache.items():
        best = db.get(key, {}).get("best")
        if a.get("tail") and best and a["rounds"] >= best["rounds"]:
            a["tail"] = ""


def best_entry(n: int, e: dict, appendix_e: dict) -> Optional[dict]:
    """The database's best for n, or App. E's result where it has fewer rounds."""
    b = e.get("best")
    a = appendix_e.get(str(n))
    if a and a["ok"] and a.get("tail") and (b is None or a["rounds"] < b["rounds"]):
        return {k: a[k] for k in ("construction", "rounds", "max_age", "beta", "tail_from",
                                  "tail")}
    return b


def _literal_rows(text: str, width: int) -> str:
    if not text:
        return ' ""'
    rows = [text[i:i + width] for i in range(0, len(text), width)]
    return "\n" + "\n".join(f'     "{r}"' for r in rows)


def cmd_emit(args) -> None:
    db = load_db(args.db)
    appendix_e = load_db(args.appendix_e)
    out = sys.stdout
    out.write("// Generated by csrc/core/tools/stragglar_search.py -- do not edit.\n")
    out.write("// StragglAR designs (format: csrc/core/stragglar_stored.cc): n, construction, "
              "largest age of the\n// circulant part, its receive ages per position 1 .. n-2, "
              "the first explicit round, the explicit\n// rounds (n-1 characters each, one "
              "string per round).\n")
    out.write("struct StragglarDesignEntry {\n  int n;\n  const char* construction;\n"
              "  int max_age;\n  const char* beta;\n  int tail_from;\n  const char* tail;\n};\n")
    out.write("constexpr StragglarDesignEntry kStragglarDesigns[] = {\n")
    for key in sorted(db, key=int):
        n, e = int(key), db[key]
        b = best_entry(n, e, appendix_e)
        cb = e.get("circulant_beta")
        if b is None:
            if not cb:
                continue
            b = {"construction": "circulant_ilp", "tail_from": 0, "tail": ""}
        if not b["beta"] and cb:
            # Keep the circulant design in the table (stragglar_circulant.cc's greedy tail and
            # the tests use it); with tail_from 0 the expansion uses none of its rounds.
            b = dict(b, beta=cb, max_age=max(AGE_CHARS.index(ch) for ch in cb))
        out.write(f'    {{{n}, "{b["construction"]}", {b["max_age"]}, "{b["beta"]}", '
                  f'{b["tail_from"]},{_literal_rows(b["tail"], n - 1)}}},\n')
    out.write("};\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", default=DB)
    ap.add_argument("--appendix-e", default=APPENDIX_E)
    ap.add_argument("--driver", default=DRIVER)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("search")
    s.add_argument("--ns", required=True, help="e.g. 3-255 or 14,30")
    s.add_argument("--budget", type=float, default=60.0, help="seconds per CP-SAT attempt")
    a = sub.add_parser("appendix-e")
    a.add_argument("--ns", required=True)
    sub.add_parser("emit")
    args = ap.parse_args()
    {"search": cmd_search, "appendix-e": cmd_appendix_e, "emit": cmd_emit}[args.cmd](args)


if __name__ == "__main__":
    main()
