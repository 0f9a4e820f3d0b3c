"""stragg.set_policy / stragg.Options: the Python ways to give settings (see _config.py)."""

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
    slowdown: str | dict[int, float] | None = _UNSET,
) -> None:
    """Sets the all_reduce policy for stragg process groups created afterwards; it overrides the
    environment variables. Every rank must set the same policy (checked at group creation).

    algo: "auto" (default; cost model, StragglAR when there is a straggler), "ring", "rhd",
      "direct", "bcast", "stragglar", "stragglar_direct" or "optcc".
    straggler: a rank (configured straggler), "auto" (default: the profiler's persistent
      straggler), "dynamic" (whoever arrives last, agreed per call) or "none".
    dynamic_window_us: wait-or-proceed window of the dynamic mode ("auto": from the cost model).
    alpha_us / bandwidth_gbps: cost-model defaults until link probes measure them.
    slowdown: ranks with a slower link for OptCC, "RANK=L,..." or {rank: L}.
    Passing None removes that override (back to the environment / default). A bad value raises
    ValueError now.
    """
    given = {
        "algo": algo,
        "straggler": straggler,
        "transport": transport,
        "dynamic_window_us": dynamic_window_us,
        "alpha_us": alpha_us,
        "bandwidth_gbps": bandwidth_gbps,
        "slowdown": slowdown,
    }
    for key, value in given.items():
        if value is _UNSET:
            continue
        if key == "straggler" and isinstance(value, bool):
            raise ValueError(f"stragg.set_policy(straggler={value!r}): expected a rank of the group, "
                             "auto, dynamic or none")
        if key == "slowdown" and isinstance(value, dict):
            value = ",".join(f"{int(r)}={float(l)!r}" for r, l in value.items()) or "none"
        _config.set_override(key, value, f"stragg.set_policy({key}={value!r})")


def reset_policy() -> None:
    """Removes every setting made with set_policy() and stragg.profiler.configure()."""
    _config._overrides.clear()


class Options:
    """Settings for one process group, given as ``pg_options``:

        dist.init_process_group("stragg", pg_options=stragg.Options(algo="ring", shm_slots=8))
        dist.new_group(ranks, backend="stragg", pg_options={"straggler": "dynamic"})

    Keys are the settings table's (``stragg.settings_table()``: the STRAGG_* variable name in
    lower case without the prefix); values are validated now (ValueError) and override the
    environment and set_policy for that group only.
    """

    def __init__(self, **settings: Any) -> None:
        known = {row["key"] for row in _config.table()}
        for key, value in settings.items():
            if key not in known:
                raise TypeError(
                    f"stragg.Options: unknown setting {key!r} (known: {', '.join(sorted(known))})"
                )
            if value is not None:
                _config._core.parse_settings([(key, _config._text(value), f"stragg.Options({key}=...)")])
        self._settings = {k: v for k, v in settings.items() if v is not None}

    def as_dict(self) -> dict[str, Any]:
        return dict(self._settings)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._settings.items())
        return f"stragg.Options({inner})"
