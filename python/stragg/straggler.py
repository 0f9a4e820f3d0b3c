"""Straggler report: who was late, how often, by how much, over which link, and what stragg does.

    import stragg
    rep = stragg.straggler_report()          # the whole job so far (default group)
    print(rep)                               # a table
    rep.to_dict()["straggler"]               # the agreed chronic straggler's rank, or None
    rep.to_json()                            # save; `python -m stragg.info --report FILE` prints

    with stragg.straggler_detection(group) as sd:   # only the calls of this section
        train_some_steps()
    print(sd.summary())

Everything comes from what the straggler profiler (stragg.profiler) has exchanged between the
ranks: every K calls all ranks hold the same per-call delays and last ranks, the same link matrix
and the same planner decisions, so a report read at the same point of the call sequence is
identical on every rank (`sync=True` makes sure of it: see straggler_report()). Calls completed
since the last exchange are not in it yet (`pending_calls` counts those of a section).

Per call, the rank that arrived last (the shortest duration: it waited for nobody) is late by the
call's delay estimate (the gap to the second-shortest duration); every other rank is late by 0.
A call whose delay is below the noise floor (STRAGG_PROFILE_NOISE_US) makes nobody late. Per rank:
calls, times last, share last (times last / calls), lateness p50 / p95 / max / mean (nearest-rank
percentiles over all calls, zeros included), an exponentially weighted lateness (span: the
profiler's window, bias-corrected), a score in [0, 1) = e / (e + noise floor) where e is the
rank's mean lateness minus the least late rank's (0: as punctual as the fastest rank, 0.5: one
noise floor later on average), and a verdict:

- chronic: share last >= chronic_share (the profiler's adopt share) over >= min_calls calls, with
  p50 lateness >= the noise floor;
- transient: not chronic, but last in >= transient_min_calls calls;
- none: otherwise.

The thresholds used are part of the report (`thresholds`). The report's `straggler` is the chronic
rank with the largest share (ties: the lowest rank), or None.

Links (from the last link probe, stragg.profiler.measure_links() or the periodic ones): per
directed link latency (alpha) and bandwidth (1/beta), its factor = beta / median beta over the
links between healthy ranks (2.0: half their median bandwidth), the degraded ranks the probes
named (only between hosts: on one host link differences are scheduling noise) and the slowest
link.

Planner: the rank StragglAR runs for (None: none), the call it runs from, the predicted gain per
call over Ring, the degraded ranks the planner routes around (OptCC), and the profiler's
decisions.

Verdict changes seen by straggler_report() are logged (logger "stragg", INFO), naming the rank, its
share and its delay.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from typing import Any

import torch.distributed as dist

from ._registration import _stragg_backend
from ._straggler_format import VERDICTS, format_report, report_metrics

__all__ = [
    "LinkReport",
    "LinkStat",
    "PlannerAction",
    "RankLateness",
    "StragglerDetection",
    "StragglerReport",
    "Thresholds",
    "VERDICTS",
    "format_report",
    "report_metrics",
    "straggler_detection",
    "straggler_report",
]

logger = logging.getLogger("stragg")

# Defaults of the thresholds that are not the profiler's own settings.
MIN_CALLS = 16
TRANSIENT_MIN_CALLS = 3


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """The numbers the verdicts were taken with."""

    noise_floor_s: float  # delays below it: nobody was late (STRAGG_PROFILE_NOISE_US)
    chronic_share: float  # chronic: last in at least this share of the calls (STRAGG_PROFILE_ADOPT)
    min_calls: int  # chronic needs at least this many calls
    transient_min_calls: int  # transient: last in at least this many calls
    ewma_span: int  # span (calls) of the exponentially weighted lateness (STRAGG_PROFILE_WINDOW)
    score_scale_s: float  # score = e / (e + this): the noise floor


@dataclasses.dataclass(frozen=True)
class RankLateness:
    rank: int
    calls: int
    times_last: int
    share_last: float
    lateness_p50_s: float
    lateness_p95_s: float
    lateness_max_s: float
    lateness_mean_s: float
    lateness_ewma_s: float
    score: float
    verdict: str  # "chronic", "transient" or "none"
    link_slowdown: float  # the link probes' slowdown factor of this rank (1.0: healthy/unknown)


@dataclasses.dataclass(frozen=True)
class LinkStat:
    src: int
    dst: int
    latency_s: float  # alpha
    bandwidth_bytes_per_s: float  # 1 / beta
    factor: float  # beta / median beta of the links between healthy ranks (> 1: slower)


@dataclasses.dataclass(frozen=True)
class LinkReport:
    measured: bool
    median_latency_s: float | None
    median_bandwidth_bytes_per_s: float | None
    degraded_ranks: dict[int, float]  # the probes' verdict: rank -> slowdown factor l
    slowest: LinkStat | None
    links: list[LinkStat]


@dataclasses.dataclass(frozen=True)
class PlannerAction:
    straggler: int | None  # StragglAR runs for it
    since_call: int | None  # the first call that used the current straggler decision
    predicted_gain_s: float  # per call over Ring, for the straggler (0 without one)
    degraded: dict[int, float]  # degraded ranks the planner routes around (OptCC)
    plan: str  # in words
    decisions: list[dict[str, Any]]  # the profiler's decisions {call, straggler, reason}


@dataclasses.dataclass(frozen=True)
class StragglerReport:
    group: str
    n: int
    scope: str  # "job" or "section"
    first_call: int  # the calls covered: [first_call, first_call + calls)
    calls: int
    pending_calls: int  # of a section: completed but not exchanged yet (not covered)
    calls_total: int  # calls the profiler has exchanged in the job
    exchanges: int
    straggler: int | None  # the chronic straggler (largest share), None if no rank is chronic
    thresholds: Thresholds
    ranks: list[RankLateness]
    links: LinkReport
    planner: PlannerAction

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (rank keys of the dicts become strings only in to_json)."""
        return dataclasses.asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    def table(self) -> str:
        return format_report(self.to_dict())

    def __str__(self) -> str:
        return self.table()


# --------------------------------------------------------------------------------------------
# Statistics (pure functions of agreed numbers: identical on every rank)


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not sorted_values:
        return 0.0
    k = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[min(k, len(sorted_values)) - 1]


def _ewma(values: list[float], span: int) -> float:
    """Bias-corrected exponentially weighted mean, weight 2 / (span + 1) on the newest value."""
    if not values:
        return 0.0
    a = 2.0 / (max(1, span) + 1.0)
    m = 0.0
    for v in values:
        m = (1 - a) * m + a * v
    return m / (1 - (1 - a) ** len(values))


def _rank_stats(
    n: int, delays: list[float], last: list[int], th: Thresholds, slowdown: list[float]
) -> list[RankLateness]:
    calls = len(delays)
    per_rank = [[0.0] * calls for _ in range(n)]
    for i, (d, r) in enumerate(zip(delays, last)):
        if 0 <= r < n:
            per_rank[r][i] = max(0.0, float(d))
    means = [sum(v) / calls if calls else 0.0 for v in per_rank]
    fastest = min(means) if means else 0.0
    out = []
    for r in range(n):
        values = per_rank[r]
        srt = sorted(values)
        times_last = sum(1 for x in last if x == r)
        share = times_last / calls if calls else 0.0
        p50 = _percentile(srt, 0.5)
        excess = means[r] - fastest
        scale = th.score_scale_s if th.score_scale_s > 0 else 1e-6
        if calls >= th.min_calls and share >= th.chronic_share and p50 >= th.noise_floor_s:
            verdict = "chronic"
        elif times_last >= th.transient_min_calls:
            verdict = "transient"
        else:
            verdict = "none"
        out.append(
            RankLateness(
                rank=r,
                calls=calls,
                times_last=times_last,
                share_last=share,
                lateness_p50_s=p50,
                lateness_p95_s=_percentile(srt, 0.95),
                lateness_max_s=srt[-1] if srt else 0.0,
                lateness_mean_s=means[r],
                lateness_ewma_s=_ewma(values, th.ewma_span),
                score=excess / (excess + scale) if excess > 0 else 0.0,
                verdict=verdict,
                link_slowdown=slowdown[r] if r < len(slowdown) else 1.0,
            )
        )
    return out


def _median(values: list[float]) -> float:
    v = sorted(values)
    m = len(v) // 2
    return v[m] if len(v) % 2 else 0.5 * (v[m - 1] + v[m])


def _links(matrix: list[list[Any]], analysis: dict[str, Any]) -> LinkReport:
    measured = [
        (i, j, float(cell[0]), float(cell[1]))
        for i, row in enumerate(matrix)
        for j, cell in enumerate(row)
        if cell is not None and i != j and cell[1] > 0
    ]
    degraded = {int(r): float(f) for r, f in sorted(analysis.get("degraded", {}).items())}
    if not measured:
        return LinkReport(False, None, None, degraded, None, [])
    # The reference: the median over links between healthy ranks (as the probes' own analysis),
    # so that a degraded host, which touches many links, does not move it.
    healthy = [b for i, j, _, b in measured if i not in degraded and j not in degraded]
    median_beta = _median(healthy or [b for _, _, _, b in measured])
    links = [
        LinkStat(src=i, dst=j, latency_s=a, bandwidth_bytes_per_s=1.0 / b, factor=b / median_beta)
        for i, j, a, b in measured
    ]
    slowest = max(links, key=lambda s: (s.factor, -s.src, -s.dst))
    return LinkReport(
        measured=True,
        median_latency_s=_median([a for _, _, a, _ in measured]),
        median_bandwidth_bytes_per_s=1.0 / median_beta,
        degraded_ranks=degraded,
        slowest=slowest,
        links=links,
    )


def _planner(s: dict[str, Any]) -> PlannerAction:
    applied = s.get("applied", {})
    straggler = applied.get("straggler")
    degraded = {int(r): float(f) for r, f in sorted(applied.get("degraded", {}).items())}
    decisions = [dict(d) for d in s.get("decisions", [])]
    since = None
    if straggler is not None:
        for d in reversed(decisions):
            if d["straggler"] == straggler:
                since = int(d["call"])
                break
    # The profiler's straggler's gain (the plan check may have undone it: then StragglAR runs
    # for nobody and there is no gain).
    own = straggler is not None and s.get("straggler") == straggler
    gain = float(s.get("straggler_gain_s", 0.0)) if own else 0.0
    parts = []
    if straggler is not None:
        where = f" from call {since}" if since is not None else ""
        parts.append(
            f"StragglAR for rank {straggler}{where}, predicted gain {gain * 1e3:.3f} ms per call"
        )
    if degraded:
        ranks = ", ".join(f"{r} (l = {f:.2f})" for r, f in degraded.items())
        parts.append(f"OptCC around degraded rank{'s' if len(degraded) > 1 else ''} {ranks}")
    plan = "; ".join(parts) if parts else "no straggler plan: the usual algorithm"
    return PlannerAction(straggler, since, gain, degraded, plan, decisions)


def _thresholds(settings: dict[str, Any]) -> Thresholds:
    noise = float(settings["noise_floor_s"])
    return Thresholds(
        noise_floor_s=noise,
        chronic_share=float(settings["adopt_share"]),
        min_calls=MIN_CALLS,
        transient_min_calls=TRANSIENT_MIN_CALLS,
        ewma_span=int(settings["window"]),
        score_scale_s=noise,
    )


# --------------------------------------------------------------------------------------------
# Building a report from the backend


def _rank_of(group: dist.ProcessGroup | None) -> int | str:
    try:
        return dist.get_rank(group)
    except Exception:  # noqa: BLE001 - only for the message
        return "?"


def _backend_for(op: str, group: dist.ProcessGroup | None) -> Any:
    """The group's stragg backend, or a TypeError naming the op, the rank and the backend."""
    if not dist.is_initialized():
        raise RuntimeError(f"{op}: torch.distributed is not initialized (no process group)")
    try:
        return _stragg_backend(group)
    except TypeError as e:
        raise TypeError(f"{op}: rank {_rank_of(group)}: {e}; reports need a stragg group") from e


def _group_name(group: dist.ProcessGroup | None) -> str:
    default = dist.distributed_c10d._get_default_group()
    if group is None or group == default:
        return "default"
    return str(getattr(group, "group_name", "") or "?")


def _summary(op: str, group: dist.ProcessGroup | None, sync: bool) -> tuple[Any, dict[str, Any]]:
    backend = _backend_for(op, group)
    s = dict(backend.profiler_summary())
    if s["enabled"] and sync:
        # A stragg barrier queues behind the exchange that may still run after this rank's
        # latest call: once it returns, every rank has taken the same exchanges.
        backend.barrier(dist.BarrierOptions()).wait()
        s = dict(backend.profiler_summary())
    if not s["enabled"]:
        raise RuntimeError(
            f"{op}: rank {_rank_of(group)}: the straggler profiler is off for group "
            f"{_group_name(group)!r} (STRAGG_PROFILE=0, a single rank, or all_reduce delegated "
            "to Gloo/NCCL); a report needs it on"
        )
    return backend, s


def _build(
    backend: Any,
    s: dict[str, Any],
    group: dist.ProcessGroup | None,
    scope: str,
    first: int | None = None,
    end: int | None = None,
) -> StragglerReport:
    n = int(s["n"])
    total = int(s["calls"])
    delays = [float(x) for x in s["delays_s"]]
    last = [int(x) for x in s["last_ranks"]]
    # The recent samples are the last len(delays) calls: [total - len, total).
    base = total - len(delays)
    lo = base if first is None else max(first, base)
    hi = total if end is None else min(end, total)
    hi = max(hi, lo)
    pending = 0 if end is None else max(0, end - max(total, lo))
    delays, last = delays[lo - base : hi - base], last[lo - base : hi - base]
    th = _thresholds(s["settings"])
    analysis = dict(backend.link_analysis())
    slowdown = [float(r["slowdown"]) for r in analysis.get("ranks", [])]
    ranks = _rank_stats(n, delays, last, th, slowdown)
    chronic = [r for r in ranks if r.verdict == "chronic"]
    straggler = max(chronic, key=lambda r: (r.share_last, -r.rank)).rank if chronic else None
    return StragglerReport(
        group=_group_name(group),
        n=n,
        scope=scope,
        first_call=lo,
        calls=hi - lo,
        pending_calls=pending,
        calls_total=total,
        exchanges=int(s["exchanges"]),
        straggler=straggler,
        thresholds=th,
        ranks=ranks,
        links=_links(backend.link_matrix(), analysis),
        planner=_planner(s),
    )


# The verdicts last reported per group, for the INFO line on a change.
_last_verdicts: dict[str, tuple[str, ...]] = {}


def _log_changes(rep: StragglerReport) -> None:
    key = f"{rep.group}/{rep.scope}"
    verdicts = tuple(r.verdict for r in rep.ranks)
    before = _last_verdicts.get(key)
    _last_verdicts[key] = verdicts
    if before == verdicts or (before is None and all(v == "none" for v in verdicts)):
        return
    for r in rep.ranks:
        old = before[r.rank] if before is not None and r.rank < len(before) else "none"
        if old != r.verdict:
            logger.info(
                "stragg: group %r: straggler verdict for rank %d: %s -> %s (last in %.1f%% of "
                "%d calls, delay p50 %.3f ms, max %.3f ms)",
                rep.group,
                r.rank,
                old,
                r.verdict,
                r.share_last * 100,
                r.calls,
                r.lateness_p50_s * 1e3,
                r.lateness_max_s * 1e3,
            )


def straggler_report(
    group: dist.ProcessGroup | None = None, *, sync: bool = False
) -> StragglerReport:
    """The straggler report of `group` (default: the default group) over the job's calls the
    profiler has exchanged (its most recent 4096 calls at most).

    Not a collective by default: it reads the agreed statistics this rank holds, identical on every
    rank that has taken the same exchanges. After a call that ends a profiler batch, that batch's
    exchange runs behind the call on stragg's worker thread; `sync=True` (a collective: every
    rank of the group must call it) first runs a stragg barrier, which queues behind it, so every
    rank reads after the same exchanges and the reports are identical.

    Raises TypeError when the group is not a stragg group, RuntimeError when its profiler is off.
    """
    backend, s = _summary("stragg.straggler_report", group, sync)
    rep = _build(backend, s, group, "job")
    _log_changes(rep)
    return rep


class StragglerDetection:
    """A section of a job: `with stragg.straggler_detection(group) as sd: ...; sd.summary()`.

    The section is the all_reduces completed on the group between entering and leaving the
    `with` block (counted on this rank; every rank runs the same calls). summary() reports the
    section's calls the profiler has exchanged so far; those completed but not yet exchanged
    (up to STRAGG_PROFILE_EVERY - 1 at the end of the section) are `pending_calls`, and are
    covered once a later exchange took them (call summary() again after more calls).
    """

    _OP = "stragg.straggler_detection"

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.start: int | None = None
        self.end: int | None = None

    def _calls(self) -> int:
        backend = _backend_for(self._OP, self.group)
        return int(backend.stats()["allreduce_calls"])

    def __enter__(self) -> StragglerDetection:
        _summary(self._OP, self.group, sync=False)  # raises now if no report can be made
        self.start = self._calls()
        self.end = None
        return self

    def __exit__(self, *exc: Any) -> None:
        self.end = self._calls()

    def summary(self, *, sync: bool = False) -> StragglerReport:
        """The section's report (see straggler_report() for `sync`)."""
        if self.start is None:
            raise RuntimeError(f"{self._OP}: summary() before the section started (use `with`)")
        end = self.end if self.end is not None else self._calls()
        backend, s = _summary(f"{self._OP}.summary", self.group, sync)
        rep = _build(backend, s, self.group, "section", first=self.start, end=end)
        _log_changes(rep)
        return rep


def straggler_detection(group: dist.ProcessGroup | None = None) -> StragglerDetection:
    """A context manager whose summary() reports only the calls made inside it."""
    return StragglerDetection(group)
