"""stragg's settings as Python sees them: one table (C++ csrc/plan/settings.cc, through
stragg._core), three sources, one parser.

A process group's settings are, in increasing priority: the defaults, the STRAGG_* environment
variables, what stragg.set_policy / stragg.profiler.configure set in this process, and the
``pg_options`` given to ``init_process_group`` / ``new_group`` (a dict or a
:class:`stragg.Options`). The C++ parser validates all of them and names the source of a bad
value (``ValueError: stragg: STRAGG_SHM_SLOTS='0' is not accepted (expected an integer from 1
to 1024)``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ._core_loader import load_core

_core = load_core()

# Settings given in Python (stragg.set_policy / stragg.profiler.configure): key -> (raw, source).
_overrides: dict[str, tuple[str, str]] = {}


def table() -> list[dict[str, Any]]:
    """Every setting: key, env, type, default, accepted, meaning, must_match."""
    return list(_core.settings_table())


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def set_override(key: str, value: Any, source: str) -> None:
    """Validates `value` for setting `key` now (ValueError naming `source`) and keeps it for
    process groups created afterwards; None removes the override."""
    if value is None:
        _overrides.pop(key, None)
        return
    raw = _text(value)
    _core.parse_settings([(key, raw, source)])
    _overrides[key] = (raw, source)


def _options_values(options: Any) -> list[tuple[str, str, str]]:
    """pg_options as (key, raw, source) triples: a mapping or an object with `as_dict()`."""
    if options is None:
        return []
    if hasattr(options, "as_dict"):
        options = options.as_dict()
    if not isinstance(options, Mapping):
        raise TypeError(
            "stragg: pg_options must be a dict of settings or stragg.Options, "
            f"got {type(options).__name__}"
        )
    return [(str(k), _text(v), f"pg_options[{k!r}]") for k, v in options.items() if v is not None]


def raw_settings(options: Any = None) -> list[tuple[str, str, str]]:
    """(key, raw, source) for every setting given anywhere, lowest priority first."""
    values: list[tuple[str, str, str]] = []
    gloo_ifname = os.environ.get("GLOO_SOCKET_IFNAME", "").strip()
    if gloo_ifname:
        # Gloo's interface list (exact names) unless STRAGG_SOCKET_IFNAME says otherwise.
        values.append(("socket_ifname", "=" + gloo_ifname, "GLOO_SOCKET_IFNAME"))
    for row in _core.settings_table():
        raw = os.environ.get(row["env"])
        if raw is not None and raw.strip() != "":
            values.append((row["key"], raw, row["env"]))
    values.extend((k, raw, src) for k, (raw, src) in _overrides.items())
    values.extend(_options_values(options))
    return values


def effective_settings(options: Any = None) -> dict[str, str]:
    """Every setting's value in force for a group created now (canonical text), validated."""
    return dict(_core.parse_settings(raw_settings(options)))


def debug_level() -> str:
    """STRAGG_DEBUG: "" (off), "INFO" (group set-up decisions) or "DETAIL" (also every call)."""
    raw = os.environ.get("STRAGG_DEBUG", "")
    if raw.strip() == "":
        return ""
    level = _core.parse_settings([("debug", raw, "STRAGG_DEBUG")])["debug"]
    return "" if level == "off" else level


def settings_markdown() -> str:
    """docs/settings.md's table of environment variables, generated from the settings table."""
    lines = [
        "| variable | default | accepted | must match | meaning |",
        "|---|---|---|---|---|",
    ]
    for row in _core.settings_table():
        default = f"`{row['default']}`" if row["default"] else "(automatic)"
        must = "yes" if row["must_match"] else ""
        lines.append(
            f"| `{row['env']}` | {default} | {row['accepted']} | {must} | {row['meaning']} |"
        )
    return "\n".join(lines)
