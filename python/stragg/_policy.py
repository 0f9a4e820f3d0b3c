"""stragg.set_policy: the Python equivalent of STRAGG_ALGO / STRAGG_STRAGGLER / STRAGG_TRANSPORT."""

from __future__ import annotations

from typing import Any

from . import _config

_UNSET: Any = object()


def set_policy(
    algo: str | None = _UNSET,
    straggler: int | str | None = _UNSET,
    *,
    transport: str | None = _UNSET,
    dynamic_window_us: int | str | None = _UNSET,
    alpha_us: float | None = _UNSET,
    bandwidth_gbps: float | None = _UNSET,
) -> None:
    """Sets the all_reduce policy for stragg process groups created afterwards; it overrides the
    environment variables. Every rank must set the same policy (checked at group creation).

    algo: "auto" (default; cost model, StragglAR when there is a straggler), "ring", "rhd",
      "direct", "bcast", "stragglar" or "optcc".
    straggler: a rank (configured straggler), "auto" (default: the profiler's persistent
      straggler), "dynamic" (whoever arrives last, agreed per call) or "none".
    dynamic_window_us: wait-or-proceed window of the dynamic mode ("auto": from the cost model).
    alpha_us / bandwidth_gbps: cost-model defaults until link probes measure them.
    Passing None removes that override (back to the environment / default).
    """
    o = _config._overrides
    if algo is not _UNSET:
        if algo is None:
            o.pop("algo", None)
        else:
            a = str(algo).strip().lower()
            if a not in _config.ALGORITHMS:
                raise ValueError(
                    f"stragg.set_policy: algo={algo!r} is not one of {', '.join(_config.ALGORITHMS)}"
                )
            o["algo"] = a
    if straggler is not _UNSET:
        if straggler is None:
            o.pop("straggler", None)
        else:
            o["straggler"] = _config.parse_straggler(straggler, "straggler")
    if transport is not _UNSET:
        if transport is None:
            o.pop("transport", None)
        else:
            t = str(transport).strip().lower()
            if t not in _config.TRANSPORTS:
                raise ValueError(
                    f"stragg.set_policy: transport={transport!r} is not one of "
                    f"{', '.join(_config.TRANSPORTS)}"
                )
            o["transport"] = t
    if dynamic_window_us is not _UNSET:
        if dynamic_window_us is None:
            o.pop("dynamic_window_us", None)
        elif str(dynamic_window_us).strip().lower() == "auto":
            o["dynamic_window_us"] = -1
        else:
            w = int(dynamic_window_us)
            if w < 0:
                raise ValueError("stragg.set_policy: dynamic_window_us must be >= 0 or 'auto'")
            o["dynamic_window_us"] = w
    for name, key, value, conv in (
        ("alpha_us", "alpha_s", alpha_us, lambda v: v * 1e-6),
        ("bandwidth_gbps", "beta_s_per_byte", bandwidth_gbps, lambda v: 1.0 / (v * 1e9)),
    ):
        if value is _UNSET:
            continue
        if value is None:
            o.pop(key, None)
            continue
        v = float(value)
        if not v > 0 and not (name == "alpha_us" and v == 0):
            raise ValueError(f"stragg.set_policy: {name} must be positive")
        o[key] = conv(v)


def reset_policy() -> None:
    """Removes every setting made with set_policy() and stragg.profiler.configure()."""
    _config._overrides.clear()
