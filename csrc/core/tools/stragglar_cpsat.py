"""CP-SAT models of StragglAR's post-arrival phase (offline; needs `pip install ortools`).

Round structure (csrc/core/stragglar.cc): n ranks, straggler n - 1, m = n - 1 chunks; in round
r < m rank r and the straggler exchange chunk r, which makes it fully reduced on both; every other
transfer copies a fully reduced chunk. Per round every rank sends at most one chunk and receives
at most one (not necessarily to and from the same peer); the straggler sends from round m on and
then holds every chunk. The schedule is complete when every rank holds every chunk.

The models never name a receiver's sender: per round and chunk, the receivers are at most as many
as the free holders, and any such choice can be completed to senders (stragglar_stored.cc does
it with a bipartite matching when it expands a design). Two models:

* full: one boolean per (round, rank, chunk) receive and send. Exact; practical up to n ~ 46.
* circulant + free tail: rounds before T0 follow a circulant design chosen by the solver (the
  design is a receive age per chunk offset d = rank - chunk mod m and a send set per offset and
  age, translation invariant; symmetry breaking of the full model), rounds T0 .. R - 1 are free
  as in the full model. The design's receives and sends are constrained once per position (the
  steady state), which implies every earlier round.

Both return a Design: `beta` (receive age per position y = 1 .. m-1 of the circulant part, empty
for the full model), `tail_from` (= T0) and `tail` (per round T0 .. R-1 the chunk each
non-straggler rank receives, -1 for none).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from ortools.sat.python import cp_model


@dataclasses.dataclass
class Design:
    n: int
    rounds: int
    construction: str
    beta: list[int]  # receive age of positions 1 .. m-1 (circulant part), [] if none
    tail_from: int
    tail: list[list[int]]  # per round tail_from .. rounds-1: chunk received per rank 0..m-1


class _Tail:
    """Free receive/send booleans for rounds t0 .. R-1 of the chunks still incomplete."""

    def __init__(self, model: cp_model.CpModel, n: int, rounds: int, t0: int, first_chunk: int):
        m, sig = n - 1, n - 1
        self.x: dict[tuple[int, int, int], cp_model.IntVar] = {}
        self.s: dict[tuple[int, int, int], cp_model.IntVar] = {}
        for c in range(first_chunk, m):
            for r in range(max(c + 1, t0), rounds):
                for v in range(m):
                    if v != c and not (r < m and v == r):
                        self.x[r, v, c] = model.NewBoolVar("")
                for u in range(m):
                    if not (r < m and u == r):
                        self.s[r, u, c] = model.NewBoolVar("")
                if r >= m:
                    self.s[r, sig, c] = model.NewBoolVar("")

    def add_port_constraints(self, model: cp_model.CpModel) -> None:
        by_rv: dict = {}
        by_ru: dict = {}
        by_rc_x: dict = {}
        by_rc_s: dict = {}
        for (r, v, c), var in self.x.items():
            by_rv.setdefault((r, v), []).append(var)
            by_rc_x.setdefault((r, c), []).append(var)
        for (r, u, c), var in self.s.items():
            by_ru.setdefault((r, u), []).append(var)
            by_rc_s.setdefault((r, c), []).append(var)
        for group in by_rv.values():
            model.AddAtMostOne(group)
        for group in by_ru.values():
            model.AddAtMostOne(group)
        for key, group in by_rc_x.items():
            model.Add(sum(group) <= sum(by_rc_s.get(key, [])))

    def receives(self, v: int, c: int, before: int) -> list:
        return [self.x[r, v, c] for r in range(c + 1, before) if (r, v, c) in self.x]


def _solve(model: cp_model.CpModel, time_limit: float, seed: int, workers: int):
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    status = solver.Solve(model)
    return solver, status


def _tail_table(solver, tail: _Tail, n: int, rounds: int, t0: int) -> list[list[int]]:
    table = [[-1] * (n - 1) for _ in range(t0, rounds)]
    for (r, v, c), var in tail.x.items():
        if solver.Value(var):
            table[r - t0][v] = c
    return table


def solve_full(n: int, rounds: int, time_limit: float, seed: int = 0, workers: int = 2):
    """Exact model. Returns (status name, Design or None)."""
    m, sig = n - 1, n - 1
    model = cp_model.CpModel()
    tail = _Tail(model, n, rounds, 0, 0)

    def held(u: int, c: int, r: int):
        if u == sig:
            return 1 if r >= m else 0
        if u == c:
            return 1 if r > c else 0
        return sum(tail.receives(u, c, r))

    for (r, u, c), var in tail.s.items():
        _bound_send(model, var, held(u, c, r))
    for v in range(m):
        for c in range(m):
            if v != c:
                model.AddExactlyOne(tail.receives(v, c, rounds))
    tail.add_port_constraints(model)
    solver, status = _solve(model, time_limit, seed, workers)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return solver.StatusName(status), None
    return solver.StatusName(status), Design(n, rounds, "cpsat_full", [], 0,
                                             _tail_table(solver, tail, n, rounds, 0))


def _bound_send(model: cp_model.CpModel, var, held) -> None:
    if isinstance(held, int):
        if held == 0:
            model.Add(var == 0)
    else:
        model.Add(var <= held)


def solve_circulant_tail(n: int, rounds: int, t0: int, max_age: int, time_limit: float,
                         seed: int = 0, workers: int = 2, beta: Optional[list[int]] = None):
    """Circulant design (ages 1 .. max_age) for rounds < t0, free rounds t0 .. rounds-1.

    With `beta` (receive age per position 1 .. m-1) the design's receives are fixed (a hint from a
    stored or constructed design); its sends are still the solver's.
    """
    m, sig = n - 1, n - 1
    ages = range(1, max_age + 1)
    model = cp_model.CpModel()
    R, _ = _circulant_template(model, m, max_age, beta)
    tail = _Tail(model, n, rounds, t0, max(0, t0 - max_age))

    def pre(v: int, c: int) -> list:
        d = (v - c) % m
        return [R[d, a] for a in ages if c + a < t0 and (d, a) in R]

    def held(u: int, c: int, r: int):
        if u == sig:
            return 1 if r >= m else 0
        if u == c:
            return 1 if r > c else 0
        return sum(pre(u, c)) + sum(tail.receives(u, c, r))

    for (r, u, c), var in tail.s.items():
        _bound_send(model, var, held(u, c, r))
    for v in range(m):
        for c in range(max(0, t0 - max_age), m):
            if v != c:
                model.Add(sum(pre(v, c)) + sum(tail.receives(v, c, rounds)) == 1)
    tail.add_port_constraints(model)
    solver, status = _solve(model, time_limit, seed, workers)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return solver.StatusName(status), None
    design = Design(n, rounds, "cpsat_circulant", _beta_of(solver, R, m), t0,
                    _tail_table(solver, tail, n, rounds, t0))
    return solver.StatusName(status), design


def _beta_of(solver, R: dict, m: int) -> list[int]:
    """Receive age per position 1 .. m-1 of a solved design (position y = offset - age)."""
    beta = [0] * (m - 1)
    for (d, a), var in R.items():
        if solver.Value(var):
            beta[(d - a) % m - 1] = a
    return beta


def _circulant_template(model: cp_model.CpModel, m: int, max_age: int,
                        beta: Optional[list[int]]):
    """Receive/send booleans R[d, a], S[d, a] of a circulant design and its per-position rules."""
    ages = range(1, max_age + 1)
    # R[d, a]: the rank at offset d from a chunk's birth rank receives it at age a; S[d, a]: sends
    # it at age a. Offset a at age a is that round's straggler partner (round < m): excluded.
    R = {(d, a): model.NewBoolVar("") for d in range(1, m) for a in ages if d != a % m}
    S = {(d, a): model.NewBoolVar("") for d in range(m) for a in ages if d != a % m}
    for d in range(1, m):
        model.AddExactlyOne([R[d, a] for a in ages if (d, a) in R])
    for y, a in enumerate(beta or [], start=1):
        model.Add(R[(y + a) % m, a] == 1)
    for y in range(m):  # position y (rank - round) receives / sends at most once per round
        model.AddAtMostOne([R[k] for a in ages if (k := ((y + a) % m, a)) in R])
        model.AddAtMostOne([S[k] for a in ages if (k := ((y + a) % m, a)) in S])
    for a in ages:  # per age: enough senders for the receivers
        model.Add(sum(v for (d, b), v in S.items() if b == a) >=
                  sum(v for (d, b), v in R.items() if b == a))
    for (d, a), v in S.items():  # send only a chunk already held
        if d != 0:
            model.Add(v <= sum(R[d, b] for b in range(1, a) if (d, b) in R))
    return R, S


def solve_circulant_last_chunks(n: int, rounds: int, free_chunks: int, max_age: int,
                                time_limit: float, seed: int = 0, workers: int = 2,
                                beta: Optional[list[int]] = None):
    """Circulant design for chunks 0 .. m-K-1 in every round; chunks m-K .. m-1 free (K =
    free_chunks). The design's chunks must finish in time: m - K - 1 + max_age <= rounds - 1."""
    m, sig = n - 1, n - 1
    first_free = m - free_chunks
    if first_free - 1 + max_age > rounds - 1:
        raise ValueError("design chunks cannot finish in time")
    model = cp_model.CpModel()
    R, S = _circulant_template(model, m, max_age, beta)
    tail = _Tail(model, n, rounds, first_free + 1, first_free)
    # Rounds in which free chunks move: the design's receives/sends of older chunks share ports.
    for r in range(first_free + 1, rounds):
        old = [c for c in range(max(0, r - max_age), min(r, first_free))]
        for v in range(m):
            recv = [R[k] for c in old if (k := ((v - c) % m, r - c)) in R]
            send = [S[k] for c in old if (k := ((v - c) % m, r - c)) in S]
            recv += [tail.x[k] for c in range(first_free, m) if (k := (r, v, c)) in tail.x]
            send += [tail.s[k] for c in range(first_free, m) if (k := (r, v, c)) in tail.s]
            model.AddAtMostOne(recv)
            model.AddAtMostOne(send)

    def held(u: int, c: int, r: int):
        if u == sig:
            return 1 if r >= m else 0
        if u == c:
            return 1 if r > c else 0
        return sum(tail.receives(u, c, r))

    for (r, u, c), var in tail.s.items():
        _bound_send(model, var, held(u, c, r))
    for v in range(m):
        for c in range(first_free, m):
            if v != c:
                model.AddExactlyOne(tail.receives(v, c, rounds))
    tail.add_port_constraints(model)  # per-(round, chunk) balance; ports are added above too
    solver, status = _solve(model, time_limit, seed, workers)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return solver.StatusName(status), None
    # The stored form is "design before tail_from, explicit receives after": list every receive
    # from round first_free + 1 on, design chunks included.
    t0 = first_free + 1
    table = [[-1] * m for _ in range(t0, rounds)]
    for r in range(t0, rounds):
        for c in range(max(0, r - max_age), min(r, first_free)):
            for v in range(m):
                k = ((v - c) % m, r - c)
                if k in R and solver.Value(R[k]):
                    table[r - t0][v] = c
    for (r, v, c), var in tail.x.items():
        if solver.Value(var):
            table[r - t0][v] = c
    return solver.StatusName(status), Design(n, rounds, "cpsat_circulant_chunks",
                                             _beta_of(solver, R, m), t0,
                                             table)
