"""Straggler profiler: who is persistently late, by how much, and whether StragglAR pays off.

Every all_reduce on a stragg group is timed on each rank (from when the rank was ready to when it
finished). The rank with the shortest duration arrived last (it waited for nobody), and the gap to
the second-shortest estimates the straggler's delay: no clock synchronisation is needed
(StragglAR App. C). Every K calls the ranks exchange these durations with one small all_reduce,
so every rank holds the same statistics and takes the same decision: the persistent straggler
(the rank last in most of the window's calls) and whether StragglAR beats Ring for it under the
alpha-beta cost model (critical-delay rule, StragglAR App. B), with alpha/beta measured by link
probes (AdapCC §IV-B) at the first exchange and periodically. With STRAGG_ALGO=auto and
STRAGG_STRAGGLER=auto (the defaults) the backend then runs StragglAR for that rank; hysteresis
(adopt/drop shares, patience) keeps it from flapping, and it falls back to the no-straggler
algorithm when persistence or the predicted gain goes away.

    import stragg.profiler
    print(stragg.profiler.report())           # table
    s = stragg.profiler.summary()             # dict (same on every rank after an exchange)
    stragg.profiler.plot("straggler.png")     # delay CDF + who-was-last histogram
    stragg.profiler.measure_links()           # collective: per-link alpha/beta now

Settings (environment, or stragg.profiler.configure(...) before the group is created):
STRAGG_PROFILE=1|0, STRAGG_PROFILE_EVERY (K, default 16), STRAGG_PROFILE_WINDOW (64 calls),
STRAGG_PROFILE_ADOPT (0.5), STRAGG_PROFILE_DROP (0.3), STRAGG_PROFILE_PATIENCE (2 exchanges),
STRAGG_PROFILE_MIN_GAIN_US (0), STRAGG_PROFILE_NOISE_US (100), STRAGG_PROBE_EVERY (64 exchanges;
0 = only on demand).
"""

from __future__ import annotations

import json
from typing import Any

import torch.distributed as dist

from . import _config
from ._registration import _stragg_backend

__all__ = ["configure", "dump_json", "measure_links", "plot", "report", "summary", "to_json"]

_SETTINGS = {
    # name: (settings-table key, type, factor from the Python unit to the table's)
    "enabled": ("profile", bool, None),
    "every": ("profile_every", int, None),
    "window": ("profile_window", int, None),
    "adopt_share": ("profile_adopt", float, None),
    "drop_share": ("profile_drop", float, None),
    "patience": ("profile_patience", int, None),
    "min_gain_s": ("profile_min_gain_us", float, 1e6),
    "noise_floor_s": ("profile_noise_us", float, 1e6),
    "probe_every": ("probe_every", int, None),
}


def configure(**settings: Any) -> None:
    """Profiler settings for stragg groups created afterwards (override the environment).

    Keys: enabled, every, window, adopt_share, drop_share, patience, min_gain_s, noise_floor_s,
    probe_every. A value of None removes the override. An invalid value raises ValueError now,
    naming the setting; a combination that is invalid (drop_share above adopt_share) raises when
    the group is created.
    """
    for name, value in settings.items():
        if name not in _SETTINGS:
            raise TypeError(
                f"stragg.profiler.configure: unknown setting {name!r} "
                f"(expected one of {', '.join(_SETTINGS)})"
            )
        key, kind, factor = _SETTINGS[name]
        if value is not None:
            if kind is bool and not isinstance(value, bool):
                raise TypeError(f"stragg.profiler.configure: {name} must be a bool")
            if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"stragg.profiler.configure: {name} must be an int")
            if factor is not None:
                value = float(value) * factor
        _config.set_override(key, value, f"stragg.profiler.configure({name}={settings[name]!r})")


def summary(group: dist.ProcessGroup | None = None) -> dict[str, Any]:
    """The profiler's state for `group` (default group) on this rank.

    Keys: enabled, n, calls, exchanges, straggler (rank StragglAR runs for, or None), candidate,
    candidate_share, median_delay_s, critical_delay_s, predicted_gain_s (for the candidate),
    straggler_share and straggler_gain_s (the same for the straggler), last_counts (per rank),
    window_last_counts, delays_s (recent per-call delay estimates), last_ranks (aligned with
    delays_s; -1 = nobody significantly late), decisions (list of {call, straggler, reason}),
    link ({alpha_s, beta_s_per_byte, source}), settings, probes ({campaigns, slices, seconds,
    transfer_bytes}), exchange_every, exchange_seconds (this rank's time in exchanges: with
    probes' seconds, the profiler's own cost), applied ({straggler, degraded, mode}: what the plan
    check lets run), plan_checks (every trial: {call, change, kept, chosen, period_s, baseline_s,
    rounds (1, or 2 when the first was within the noise), arms: [{mode, s (per call), error_s
    (its standard error), calls}]}), model_corrections ({plan family: measured / predicted}).
    Everything but the counters of calls not yet exchanged and this rank's times is identical on
    every rank.
    """
    return dict(_stragg_backend(group).profiler_summary())


def to_json(group: dist.ProcessGroup | None = None, indent: int | None = 2) -> str:
    """summary() as JSON."""
    return json.dumps(summary(group), indent=indent, sort_keys=True)


def dump_json(path: str, group: dist.ProcessGroup | None = None) -> str:
    """Writes summary() as JSON to `path`; returns the path."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(to_json(group))
        f.write("\n")
    return path


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def report(group: dist.ProcessGroup | None = None) -> str:
    """A readable table of summary()."""
    s = summary(group)
    if not s["enabled"]:
        return "stragg profiler: off for this group (STRAGG_PROFILE=0, one rank, or delegated)"
    link = s["link"]
    lines = [
        f"stragg profiler: {s['n']} ranks, {s['calls']} calls profiled, "
        f"{s['exchanges']} exchanges",
        f"  straggler in use : {s['straggler'] if s['straggler'] is not None else 'none'}",
        f"  candidate        : {s['candidate'] if s['candidate'] is not None else 'none'} "
        f"(last in {s['candidate_share'] * 100:.1f}% of the window's significant calls)",
        f"  median delay     : {_ms(s['median_delay_s'])}   critical delay: "
        f"{_ms(s['critical_delay_s'])}   predicted gain/call: {_ms(s['predicted_gain_s'])}",
        f"  cost model       : alpha {link['alpha_s'] * 1e6:.1f} us, "
        f"{1e-9 / link['beta_s_per_byte']:.2f} GB/s ({link['source']})",
        "  rank  last(all)  last(window)",
    ]
    for r in range(s["n"]):
        all_count = s["last_counts"][r] if r < len(s["last_counts"]) else 0
        win_count = s["window_last_counts"][r] if r < len(s["window_last_counts"]) else 0
        lines.append(f"  {r:>4}  {all_count:>9}  {win_count:>12}")
    if s["decisions"]:
        lines.append("  decisions:")
        for d in s["decisions"]:
            who = d["straggler"] if d["straggler"] is not None else "none"
            lines.append(f"    from call {d['call']}: straggler {who}: {d['reason']}")
    return "\n".join(lines)


def plot(path: str, group: dist.ProcessGroup | None = None, title: str = "") -> str:
    """Saves the straggler-delay CDF and the who-was-last histogram (PNG, matplotlib)."""
    from ._plot import plot_summary

    return plot_summary(summary(group), path, title=title)


def measure_links(group: dist.ProcessGroup | None = None) -> dict[str, Any]:
    """Collective (all ranks, in the same order as their all_reduces): measures every link's
    alpha/beta now (AdapCC §IV-B: m messages of s bytes vs one of m*s; alpha is at least half a
    one-element round trip, since a schedule's round waits for its peer) and installs the median as
    the cost model. Returns {"alpha_s", "beta_s_per_byte", "links": n x n [alpha_s, beta] (None
    where not measured)}."""
    backend = _stragg_backend(group)
    backend.measure_links().wait()
    links = [[None if v is None else list(v) for v in row] for row in backend.link_matrix()]
    link = backend.profiler_summary()["link"]
    return {"alpha_s": link["alpha_s"], "beta_s_per_byte": link["beta_s_per_byte"], "links": links}
