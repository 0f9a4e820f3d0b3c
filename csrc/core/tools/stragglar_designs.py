#!/usr/bin/env python3
"""Offline ILP for StragglAR circulant designs (non-power-of-2 n): the receive ages per position.

Model (see csrc/core/stragglar_circulant.cc): ranks on Z_m, m = n - 1; in round r rank g
sits at position y = g - r (mod m), position 0 being the straggler's partner. Every position y != 0
receives the chunk of age beta(y) (offset d = y + beta(y) from the chunk's birth rank) and sends the
chunk of age alpha(y). Constraints (a 0/1 ILP, solved with scipy's HiGHS MILP):
  * every position receives exactly once, every offset d != 0 is received exactly once, none at 0;
  * a position may send age a only if offset y + a received at an age < a (offset 0: always);
  * for every age, #senders == #receivers.
Ages run 1..A with A = ceil(log2 n) + 1 (A = ceil(log2 n) is infeasible for non-power-of-2 n:
sum_y beta(y) must be a multiple of m). Only beta is stored; stragglar_circulant.cc recomputes
alpha by a b-matching. These designs are each n's `circulant_beta` in stragglar_designs.json, the
base of stragglar_search.py's CP-SAT model (which frees only the last chunks); that tool writes
stragglar_designs.inc. Needs scipy (not a build dependency). Usage (prints n and beta per line):
  python3 csrc/core/tools/stragglar_designs.py --min-n 5 --max-n 20
"""
import argparse
import math

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp


def design(m, A, time_limit=120.0):
    ages = range(1, A + 1)
    idx = {}
    for kind in ("x", "s"):
        for y in range(1, m):
            for a in ages:
                idx[(kind, y, a)] = len(idx)
    N = len(idx)
    rows, lo, hi = [], [], []

    def row(coef, l, h):
        r = np.zeros(N)
        for k, v in coef.items():
            r[idx[k]] += v
        rows.append(r)
        lo.append(l)
        hi.append(h)

    for y in range(1, m):
        row({("x", y, a): 1 for a in ages}, 1, 1)
        row({("s", y, a): 1 for a in ages}, 0, 1)
    for d in range(m):
        coef = {("x", (d - a) % m, a): 1 for a in ages if (d - a) % m != 0}
        if coef:
            row(coef, 0 if d == 0 else 1, 0 if d == 0 else 1)
    for y in range(1, m):
        for a in ages:
            off = (y + a) % m
            if off == 0:
                continue
            coef = {("s", y, a): 1}
            for b in ages:
                if b < a and (off - b) % m != 0:
                    key = ("x", (off - b) % m, b)
                    coef[key] = coef.get(key, 0) - 1
            row(coef, -np.inf, 0)
    for a in ages:
        coef = {}
        for y in range(1, m):
            coef[("s", y, a)] = 1
            coef[("x", y, a)] = coef.get(("x", y, a), 0) - 1
        row(coef, 0, 0)
    res = milp(np.zeros(N), constraints=LinearConstraint(np.array(rows), lo, hi),
               integrality=np.ones(N), bounds=Bounds(0, 1), options={"time_limit": time_limit})
    if res.x is None:
        return None
    return [next(a for a in ages if res.x[idx[("x", y, a)]] > 0.5) for y in range(1, m)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-n", type=int, default=3)
    ap.add_argument("--max-n", type=int, default=256)
    args = ap.parse_args()
    for n in range(args.min_n, args.max_n + 1):
        if n & (n - 1) == 0:
            continue
        beta = design(n - 1, math.ceil(math.log2(n)) + 1)
        print(n, "".join(map(str, beta)) if beta is not None else "none", flush=True)


if __name__ == "__main__":
    main()
