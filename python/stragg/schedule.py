"""Schedules: build, verify, print and serialise allreduce schedules (torch-free).

    >>> from stragg import schedule
    >>> s = schedule.build("stragglar", 8, straggler=3)
    >>> s.num_rounds, bool(s.verify())
    (15, True)
    >>> print(s)            # table: one row per step, one column per rank

CLI::

    python -m stragg.schedule list
    python -m stragg.schedule show stragglar --n 8 [--param straggler=3] [--json]
    python -m stragg.schedule verify ring rhd direct stragglar bcast optcc --n 2..64
    python -m stragg.schedule rounds stragglar --n 2..64 [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from stragg._core_loader import load_core

_core = load_core()

ScheduleError = _core.ScheduleError  # subclass of ValueError


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    error: str

    def __bool__(self) -> bool:
        return self.ok


class Schedule:
    """A schedule for n ranks over num_chunks chunks (see csrc/core/ir.h for the model)."""

    def __init__(self, core_schedule: Any) -> None:
        self._s = core_schedule

    # -- shape
    @property
    def algorithm(self) -> str:
        return self._s.algorithm

    @property
    def collective(self) -> str:
        return self._s.collective

    @property
    def n(self) -> int:
        return self._s.n

    @property
    def num_chunks(self) -> int:
        return self._s.num_chunks

    @property
    def segments(self) -> int:
        return self._s.segments

    @property
    def num_steps(self) -> int:
        return self._s.num_steps

    @property
    def num_rounds(self) -> int:
        """Rounds (alpha terms), including pre-arrival rounds."""
        return self._s.num_rounds

    @property
    def num_post_arrival_rounds(self) -> int:
        """Rounds that need the straggler (StragglAR's n + log2 n - 2 for power-of-2 n)."""
        return self._s.num_post_arrival_rounds

    @property
    def phases(self) -> list[str]:
        return list(self._s.phases)

    @property
    def stragglers(self) -> list[int]:
        return list(self._s.stragglers)

    @property
    def chunk_weights(self) -> list[float]:
        return list(self._s.chunk_weights)

    @property
    def rank_slowdown(self) -> list[float]:
        return list(self._s.rank_slowdown)

    @property
    def params(self) -> dict[str, Any]:
        return json.loads(self._s.params_json)

    @property
    def core(self) -> Any:
        """The underlying stragg._core.Schedule (for stragg.sim)."""
        return self._s

    # -- content
    def steps(self) -> list[dict[str, Any]]:
        return self._s.steps()

    def rank_program(self, rank: int) -> list[dict[str, Any]]:
        """Per-rank list of steps with ``send`` (peer, chunk, count) / ``recv`` (peer, chunk, count, op)."""
        return self._s.rank_program(rank)

    def chunk_ranges(self, num_elements: int) -> list[tuple[int, int]]:
        """(offset, length) of every chunk on a buffer of num_elements elements."""
        return [tuple(x) for x in self._s.chunk_ranges(num_elements)]

    def verify(self) -> VerifyResult:
        ok, err = self._s.verify()
        return VerifyResult(bool(ok), str(err))

    def to_json(self, indent: int | None = None) -> str:
        return self._s.to_json(-1 if indent is None else indent)

    def table(self, max_steps: int | None = None) -> str:
        return self._s.table(-1 if max_steps is None else max_steps)

    def summary(self) -> str:
        return self._s.summary()

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return f"<stragg.schedule.Schedule {self.summary()}>"


def build(algo: str, n: int, **params: Any) -> Schedule:
    """Build a schedule by name, e.g. ``build("optcc", 16, straggler=3, slowdown=1.5, segments=8)``."""
    return Schedule(_core.build(algo, int(n), json.dumps(params)))


def from_json(text: str) -> Schedule:
    return Schedule(_core.from_json(text))


def algorithms() -> list[str]:
    return list(_core.algorithm_names())


def stragglar_round_lower_bound(n: int) -> int:
    return int(_core.stragglar_round_lower_bound(n))


# ----------------------------------------------------------------------------------------- CLI
def parse_n(spec: str) -> list[int]:
    """ "8", "2..64", "2,4,8" or "2..64:2" (step)."""
    out: list[int] = []
    for part in spec.split(","):
        step = 1
        if ":" in part:
            part, step_s = part.split(":", 1)
            step = int(step_s)
        if ".." in part:
            lo, hi = part.split("..", 1)
            out.extend(range(int(lo), int(hi) + 1, step))
        else:
            out.append(int(part))
    return out


def parse_params(items: Iterable[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"--param expects key=value, got {item!r}")
        key, value = item.split("=", 1)
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


def _cmd_show(args: argparse.Namespace) -> int:
    params = parse_params(args.param)
    for n in parse_n(args.n):
        s = build(args.algo[0], n, **params)
        if args.json:
            print(s.to_json(indent=2))
        else:
            print(s.table(args.max_steps))
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    params = parse_params(args.param)
    rows = []
    failed = 0
    for algo in args.algo:
        for n in parse_n(args.n):
            try:
                s = build(algo, n, **params)
            except ScheduleError as e:  # e.g. rhd_reduce_scatter for non-power-of-2 n
                rows.append({"algo": algo, "n": n, "ok": None, "error": str(e)})
                continue
            v = s.verify()
            failed += 0 if v.ok else 1
            rows.append(
                {"algo": algo, "n": n, "ok": v.ok, "rounds": s.num_rounds, "error": v.error}
            )
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            status = "skip" if r["ok"] is None else ("ok" if r["ok"] else "FAIL")
            extra = f"rounds={r['rounds']}" if "rounds" in r else ""
            print(f"{r['algo']:<22} n={r['n']:<5} {status:<5} {extra} {r['error']}")
    return 1 if failed else 0


def _cmd_rounds(args: argparse.Namespace) -> int:
    params = parse_params(args.param)
    rows = []
    for algo in args.algo:
        for n in parse_n(args.n):
            t0 = time.perf_counter()
            s = build(algo, n, **params)
            ms = (time.perf_counter() - t0) * 1e3
            row = {
                "algo": algo,
                "n": n,
                "rounds": s.num_rounds,
                "post_arrival_rounds": s.num_post_arrival_rounds,
                "generate_ms": round(ms, 3),
            }
            if algo == "stragglar":
                row["lower_bound"] = stragglar_round_lower_bound(n)
            rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'algo':<14} {'n':>5} {'rounds':>7} {'post':>6} {'bound':>6} {'gen ms':>9}")
        for r in rows:
            print(
                f"{r['algo']:<14} {r['n']:>5} {r['rounds']:>7} {r['post_arrival_rounds']:>6} "
                f"{r.get('lower_bound', ''):>6} {r['generate_ms']:>9.2f}"
            )
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    names = algorithms()
    print(json.dumps(names) if args.json else "\n".join(names))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m stragg.schedule", description=__doc__.split("\n")[0]
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, fn, many in (
        ("show", _cmd_show, False),
        ("verify", _cmd_verify, True),
        ("rounds", _cmd_rounds, True),
    ):
        sp = sub.add_parser(name)
        sp.add_argument("algo", nargs="+" if many else 1, help="algorithm name(s), see 'list'")
        sp.add_argument("--n", default="8", help='ranks: "8", "2..64", "2,4,8", "2..64:2"')
        sp.add_argument(
            "--param", action="append", default=[], help="generator parameter key=value"
        )
        sp.add_argument("--json", action="store_true")
        sp.add_argument("--max-steps", type=int, default=None)
        sp.set_defaults(fn=fn)
    sl = sub.add_parser("list")
    sl.add_argument("--json", action="store_true")
    sl.set_defaults(fn=_cmd_list)
    args = p.parse_args(argv)
    try:
        return int(args.fn(args))
    except ScheduleError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
