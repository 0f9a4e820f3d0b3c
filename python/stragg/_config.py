"""Settings read from the environment when a stragg process group is created."""

from __future__ import annotations

import os
import re
from typing import Any

TRANSPORTS = ("auto", "shm", "tcp", "gloo")
ALGORITHMS = ("auto", "ring", "rhd", "direct", "bcast", "stragglar", "optcc")
_SIZE = re.compile(r"^\s*(\d+)\s*(|k|kib|m|mib)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "kib": 1024, "m": 1 << 20, "mib": 1 << 20}

# Settings given in Python (stragg.set_policy / stragg.profiler.configure): they override the
# environment for process groups created afterwards.
_overrides: dict[str, Any] = {}


def _float_env(name: str, default: float, lo: float | None = None, hi: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"stragg: {name}={raw!r} is not a number") from None
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ValueError(f"stragg: {name}={raw!r} must be in [{lo}, {hi}]")
    return value


def _bool_env(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "on", "yes"):
        return True
    if value in ("0", "false", "off", "no"):
        return False
    raise ValueError(f"stragg: {name}={raw!r} must be 1/0 (on/off)")


def parse_straggler(value: Any, source: str = "STRAGG_STRAGGLER") -> int:
    """A straggler setting as the C++ side wants it: a rank, -1 none, -2 dynamic, -3 auto."""
    if isinstance(value, bool):
        raise ValueError(f"stragg: {source}={value!r} must be a rank, 'auto', 'dynamic' or 'none'")
    if value is None:
        return -1
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"stragg: {source}={value} is not a rank")
        return value
    raw = str(value).strip().lower() or "auto"
    named = {"none": -1, "dynamic": -2, "auto": -3}
    if raw in named:
        return named[raw]
    if raw.isdigit():
        return int(raw)
    raise ValueError(
        f"stragg: {source}={raw!r} must be a rank of the group, 'auto', 'dynamic' or 'none'"
    )


def _size_env(name: str, default: int) -> int:
    """A non-negative integer, optionally with a KiB/MiB suffix (e.g. 512KiB)."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    match = _SIZE.match(raw)
    if not match:
        raise ValueError(f"stragg: {name}={raw!r} is not a size such as 4096, 512KiB or 1MiB")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def backend_config() -> dict[str, Any]:
    """The configuration handed to the C++ backend, from STRAGG_* environment variables."""
    transport = os.environ.get("STRAGG_TRANSPORT", "auto").strip().lower() or "auto"
    if transport not in TRANSPORTS:
        raise ValueError(
            f"stragg: STRAGG_TRANSPORT={transport!r} is not one of {', '.join(TRANSPORTS)}"
        )
    algo = os.environ.get("STRAGG_ALGO", "auto").strip().lower() or "auto"
    if algo not in ALGORITHMS:
        raise ValueError(f"stragg: STRAGG_ALGO={algo!r} is not one of {', '.join(ALGORITHMS)}")
    straggler = parse_straggler(os.environ.get("STRAGG_STRAGGLER", "auto"))
    window_raw = os.environ.get("STRAGG_DYNAMIC_WINDOW_US", "auto").strip().lower() or "auto"
    window_us = -1 if window_raw == "auto" else _size_env("STRAGG_DYNAMIC_WINDOW_US", 0)
    return {
        "log_calls": debug_level() == "DETAIL",
        "transport": transport,
        "algo": algo,
        "straggler": straggler,
        "dynamic_window_us": window_us,
        "shm_slot_bytes": _size_env("STRAGG_SHM_SLOT_BYTES", 512 * 1024),
        "shm_slots": _size_env("STRAGG_SHM_SLOTS", 4),
        "spin_us": _size_env("STRAGG_SPIN_US", 5),
        "yield_us": _size_env("STRAGG_YIELD_US", 50),
        # TCP transport: the address this rank advertises (empty: the local address that routes
        # to the store host), a fixed listening port (0: ephemeral), receive staging per peer.
        "tcp_host": os.environ.get("STRAGG_TCP_HOST", "").strip(),
        "tcp_port": _size_env("STRAGG_TCP_PORT", 0),
        "tcp_staging_bytes": _size_env("STRAGG_TCP_STAGING_BYTES", 512 * 1024),
        # Cost model defaults until the link probe measures them.
        "alpha_s": _float_env("STRAGG_ALPHA_US", 60.0, 0.0) * 1e-6,
        "beta_s_per_byte": 1.0 / (_float_env("STRAGG_BANDWIDTH_GBPS", 3.0, 1e-6) * 1e9),
        # Profiler (stragg.profiler).
        "profile": _bool_env("STRAGG_PROFILE", True),
        "profile_every": _size_env("STRAGG_PROFILE_EVERY", 16),
        "profile_window": _size_env("STRAGG_PROFILE_WINDOW", 64),
        "profile_adopt_share": _float_env("STRAGG_PROFILE_ADOPT", 0.5, 0.0, 1.0),
        "profile_drop_share": _float_env("STRAGG_PROFILE_DROP", 0.3, 0.0, 1.0),
        "profile_patience": _size_env("STRAGG_PROFILE_PATIENCE", 2),
        "profile_min_gain_s": _float_env("STRAGG_PROFILE_MIN_GAIN_US", 0.0) * 1e-6,
        "profile_noise_floor_s": _float_env("STRAGG_PROFILE_NOISE_US", 100.0, 0.0) * 1e-6,
        "probe_every": _size_env("STRAGG_PROBE_EVERY", 64),
    }


def backend_config_with_overrides() -> dict[str, Any]:
    """backend_config() with the Python-side settings applied on top."""
    config = backend_config()
    config.update(_overrides)
    return config


def debug_level() -> str:
    """STRAGG_DEBUG: "" (off), "INFO" (group set-up decisions) or "DETAIL" (also every call)."""
    level = os.environ.get("STRAGG_DEBUG", "").strip().upper()
    if level in ("", "OFF", "0"):
        return ""
    if level not in ("INFO", "DETAIL"):
        raise ValueError(f"stragg: STRAGG_DEBUG={level!r} is not one of INFO, DETAIL")
    return level
