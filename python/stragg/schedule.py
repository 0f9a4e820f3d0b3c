"""Schedules: build, verify, print and serialise allreduce schedules (torch-free).

    >>> from stragg import schedule
    >>> s = schedule.build("stragglar", 8, straggler=3)
    >>> s.num_rounds, bool(s.verify())
    (15, True)
    >>> print(s)            # table: one row per step, one column per rank

CLI::

    python -m stragg.schedule ALGO -n N [--straggler R] [--slowdown R=L ...] [--segments K] [--json]
    python -m stragg.schedule list
    python -m stragg.schedule show stragglar --n 8 [--param straggler=3] [--json]
    python -m stragg.schedule verify ring rhd direct stragglar bcast optcc --n 2..64
    python -m stragg.schedule rounds stragglar --n 2..64 [--json]

The first form builds one schedule, verifies it and prints its round table, or with ``--json``
one object with (at least) "algo", "n", "rounds", "verified" and "generation_seconds".
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


def from_json(text: str | dict[str, Any]) -> Schedule:
    """Parse a "stragg.schedule/1" document (a string or an already decoded dict).

    Only the structure is checked here (ranks, chunks, one-port, rounds); call ``verify()`` for the
    data-flow check, which is what rejects a schedule with a transfer removed or duplicated.
    """
    if not isinstance(text, str):
        text = json.dumps(text)
    return Schedule(_core.from_json(text))


def with_rank_slowdown(s: Schedule, slowdown: dict[int, float]) -> Schedule:
    """Copy of ``s`` whose ``rank_slowdown[r]`` is ``slowdown[r]`` (a degraded link, for stragg.sim)."""
    if not slowdown:
        return s
    doc = json.loads(s.to_json())
    for r, factor in slowdown.items():
        if not 0 <= r < s.n:
            raise ScheduleError(f"slowdown rank {r} out of range for n={s.n}")
        doc["rank_slowdown"][r] = float(factor)
    return from_json(doc)


def algorithms() -> list[str]:
    return list(_core.algorithm_names())


def stragglar_round_lower_bound(n: int) -> int:
    return int(_core.stragglar_round_lower_bound(n))


def stragglar_construction(n: int) -> str:
    """Which construction builds the StragglAR schedule for n (docs/schedules.md)."""
    return str(_core.stragglar_construction(n))


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


_SUBCOMMANDS = ("list", "show", "verify", "rounds")


def parse_slowdown(text: str) -> tuple[int, float]:
    """ "R=L": rank R's link is L times slower (L >= 1)."""
    rank, sep, factor = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return int(rank), float(factor)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--slowdown expects RANK=FACTOR (e.g. 3=1.5), got {text!r}"
        ) from None


def cli_build(
    algo: str,
    n: int,
    *,
    straggler: int | None = None,
    slowdown: Sequence[tuple[int, float]] = (),
    segments: int | None = None,
    params: dict[str, Any] | None = None,
) -> Schedule:
    """What the CLIs build for ``ALGO -n N [--straggler R] [--slowdown R=L ...] [--segments K]``.

    OptCC takes the ``--slowdown`` ranks as its stragglers (``--straggler``, if given, must be one
    of them and becomes the first); for every other algorithm the factors only set the schedule's
    ``rank_slowdown`` (the simulator's link model). ``--segments`` is passed to the generator,
    which rejects it unless it accepts ``segments`` (OptCC).
    """
    p: dict[str, Any] = dict(params or {})
    slow = [(int(r), float(f)) for r, f in slowdown]
    if algo == "optcc" and slow:
        ranks = [r for r, _ in slow]
        if straggler is not None:
            if straggler not in ranks:
                raise ScheduleError(
                    f"optcc: --straggler {straggler} must be one of the --slowdown ranks {ranks}"
                )
            slow.sort(key=lambda rf: rf[0] != straggler)
        if len(slow) == 1:
            p["straggler"], p["slowdown"] = slow[0]
        else:
            p["stragglers"] = [r for r, _ in slow]
            p["slowdowns"] = [f for _, f in slow]
    elif straggler is not None:
        p["straggler"] = straggler
    if segments is not None:
        p["segments"] = segments
    s = build(algo, n, **p)
    if algo != "optcc" and slow:
        s = with_rank_slowdown(s, dict(slow))
    return s


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m stragg.schedule",
        description="Build one schedule, verify it and print its round table (or --json).",
        epilog="Other forms: 'list' (algorithms), 'show ALGO --n 2..64', "
        "'verify ALGO... --n 2..64', 'rounds ALGO... --n 2..64' (each with --help).",
    )
    p.add_argument("algo", metavar="ALGO", help="generator name (see 'list')")
    p.add_argument("-n", "--n", type=int, required=True, metavar="N", help="number of ranks")
    p.add_argument("--straggler", type=int, metavar="R", help="straggler rank")
    p.add_argument(
        "--slowdown",
        type=parse_slowdown,
        action="append",
        default=[],
        metavar="R=L",
        help="rank R's link is L times slower (repeatable; OptCC's stragglers)",
    )
    p.add_argument("--segments", type=int, metavar="K", help="pipelined segments (OptCC)")
    p.add_argument(
        "--param", action="append", default=[], metavar="KEY=VALUE", help="other parameter"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--with-schedule", action="store_true", help="--json: include the schedule document"
    )
    p.add_argument("--max-steps", type=int, default=None, help="table: print at most this many")
    return p


def _main_build(argv: Sequence[str]) -> int:
    args = _build_parser().parse_args(argv)
    t0 = time.perf_counter()
    s = cli_build(
        args.algo,
        args.n,
        straggler=args.straggler,
        slowdown=args.slowdown,
        segments=args.segments,
        params=parse_params(args.param),
    )
    gen = time.perf_counter() - t0
    t0 = time.perf_counter()
    v = s.verify()
    ver = time.perf_counter() - t0
    if args.json:
        doc: dict[str, Any] = {
            "algo": s.algorithm,
            "n": s.n,
            "rounds": s.num_rounds,
            "post_arrival_rounds": s.num_post_arrival_rounds,
            "steps": s.num_steps,
            "chunks": s.num_chunks,
            "segments": s.segments,
            "stragglers": s.stragglers,
            "slowdown": {str(r): f for r, f in enumerate(s.rank_slowdown) if f != 1.0},
            "params": s.params,
            "verified": v.ok,
            "verify_error": v.error,
            "generation_seconds": gen,
            "verify_seconds": ver,
        }
        if s.algorithm == "stragglar":
            doc["lower_bound"] = stragglar_round_lower_bound(s.n)
        if args.with_schedule:
            doc["schedule"] = json.loads(s.to_json())
        print(json.dumps(doc, indent=2))
    else:
        print(s.table(args.max_steps), end="")
        status = "ok" if v.ok else f"FAILED: {v.error}"
        print(f"verified: {status}; generation {gen * 1e3:.3f} ms")
    return 0 if v.ok else 1


def _main_subcommand(argv: Sequence[str]) -> int:
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
    return int(args.fn(args))


def main(argv: Sequence[str] | None = None) -> int:
    """``ALGO -n N ...`` (the issue's form) or one of the subcommands list/show/verify/rounds."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in _SUBCOMMANDS:
            return _main_subcommand(argv)
        return _main_build(argv)
    except ScheduleError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
