"""The straggler report as text (its table) and as flat metrics for training loggers: both read
the report's dict (StragglerReport.to_dict(), or its JSON loaded back), so a saved report prints
the same (`python -m stragg.info --report FILE`)."""

from __future__ import annotations

from typing import Any

VERDICTS = ("none", "transient", "chronic")


def report_metrics(report: Any, prefix: str = "stragg/") -> dict[str, float]:
    """Flat numbers for a trainer's logger from a StragglerReport (or its dict): per rank lateness
    p50 / EWMA (ms), share last, score and verdict (0 none, 1 transient, 2 chronic), and the
    straggler (-1: none)."""
    d = report if isinstance(report, dict) else report.to_dict()
    who = d["straggler"]
    out: dict[str, float] = {f"{prefix}straggler": float(-1 if who is None else who)}
    for r in d["ranks"]:
        p = f"{prefix}rank{r['rank']}/"
        out[p + "lateness_p50_ms"] = r["lateness_p50_s"] * 1e3
        out[p + "lateness_ewma_ms"] = r["lateness_ewma_s"] * 1e3
        out[p + "share_last"] = r["share_last"]
        out[p + "score"] = r["score"]
        out[p + "verdict"] = float(VERDICTS.index(r["verdict"]))
    return out


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


def _bw(bytes_per_s: float | None) -> str:
    return "-" if bytes_per_s is None else f"{bytes_per_s * 8e-9:.3f} Gbit/s"


def format_report(d: dict[str, Any]) -> str:
    """The table of a report dict (StragglerReport.to_dict(), or its JSON loaded back)."""
    th = d["thresholds"]
    who = "none" if d["straggler"] is None else f"rank {d['straggler']}"
    first, calls = d["first_call"], d["calls"]
    span = f"calls {first}..{first + calls - 1}" if calls else "no calls"
    pending = f", {d['pending_calls']} pending" if d.get("pending_calls") else ""
    lines = [
        f"stragg straggler report: group {d['group']!r}, {d['n']} ranks, {d['scope']}: {span} "
        f"({d['calls']} calls{pending}; {d['calls_total']} in the job)",
        f"  chronic straggler: {who}",
        f"  chronic: last in >= {th['chronic_share'] * 100:.0f}% of >= {th['min_calls']} calls, "
        f"p50 lateness >= {_ms(th['noise_floor_s'])} ms; transient: last in >= "
        f"{th['transient_min_calls']} calls",
        f"  score: e / (e + {_ms(th['score_scale_s'])} ms), e = mean lateness minus the fastest "
        "rank's; lateness in ms",
        "  rank  last  share      p50      p95      max     ewma  score  link l  verdict",
    ]
    for r in d["ranks"]:
        lines.append(
            f"  {r['rank']:>4}  {r['times_last']:>4}  {r['share_last'] * 100:>4.0f}%  "
            f"{_ms(r['lateness_p50_s']):>7}  {_ms(r['lateness_p95_s']):>7}  "
            f"{_ms(r['lateness_max_s']):>7}  {_ms(r['lateness_ewma_s']):>7}  {r['score']:>5.2f}  "
            f"{r['link_slowdown']:>6.2f}  {r['verdict']}"
        )
    links = d["links"]
    if not links["measured"]:
        lines.append("  links: not measured yet (stragg.profiler.measure_links() probes them)")
    else:
        lines.append(
            f"  links: median {_bw(links['median_bandwidth_bytes_per_s'])}, latency "
            f"{links['median_latency_s'] * 1e6:.1f} us"
        )
        deg = links["degraded_ranks"]
        slow = links["slowest"]
        if not deg:
            lines.append("  degraded: none (the probes judge links between hosts only)")
        else:
            named = ", ".join(f"rank {r} (l = {f:.2f})" for r, f in deg.items())
            lines.append(f"  degraded: {named}")
            lines.append(
                f"  slowest link: {slow['src']} -> {slow['dst']}, "
                f"{_bw(slow['bandwidth_bytes_per_s'])}, {slow['factor']:.2f}x the median healthy "
                "link's time per byte"
            )
    p = d["planner"]
    lines.append(f"  planner: {p['plan']}")
    return "\n".join(lines)
