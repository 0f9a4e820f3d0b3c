"""Settings read from the environment when a stragg process group is created."""

from __future__ import annotations

import os
import re
from typing import Any

TRANSPORTS = ("auto", "shm", "tcp", "gloo")
ALGORITHMS = ("auto", "ring", "rhd", "direct", "bcast", "stragglar", "optcc")
_SIZE = re.compile(r"^\s*(\d+)\s*(|k|kib|m|mib)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "kib": 1024, "m": 1 << 20, "mib": 1 << 20}


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
    straggler_raw = os.environ.get("STRAGG_STRAGGLER", "none").strip().lower() or "none"
    if straggler_raw == "none":
        straggler = -1
    elif straggler_raw == "dynamic":
        straggler = -2
    elif straggler_raw.isdigit():
        straggler = int(straggler_raw)
    else:
        raise ValueError(
            f"stragg: STRAGG_STRAGGLER={straggler_raw!r} must be a rank of the group, 'dynamic' "
            "or 'none'"
        )
    return {
        "log_calls": debug_level() == "DETAIL",
        "transport": transport,
        "algo": algo,
        "straggler": straggler,
        "dynamic_window_us": _size_env("STRAGG_DYNAMIC_WINDOW_US", 1000),
        "shm_slot_bytes": _size_env("STRAGG_SHM_SLOT_BYTES", 512 * 1024),
        "shm_slots": _size_env("STRAGG_SHM_SLOTS", 4),
        "spin_us": _size_env("STRAGG_SPIN_US", 5),
        "yield_us": _size_env("STRAGG_YIELD_US", 50),
        # TCP transport: the address this rank advertises (empty: the local address that routes
        # to the store host), a fixed listening port (0: ephemeral), receive staging per peer.
        "tcp_host": os.environ.get("STRAGG_TCP_HOST", "").strip(),
        "tcp_port": _size_env("STRAGG_TCP_PORT", 0),
        "tcp_staging_bytes": _size_env("STRAGG_TCP_STAGING_BYTES", 512 * 1024),
    }


def debug_level() -> str:
    """STRAGG_DEBUG: "" (off), "INFO" (group set-up decisions) or "DETAIL" (also every call)."""
    level = os.environ.get("STRAGG_DEBUG", "").strip().upper()
    if level in ("", "OFF", "0"):
        return ""
    if level not in ("INFO", "DETAIL"):
        raise ValueError(f"stragg: STRAGG_DEBUG={level!r} is not one of INFO, DETAIL")
    return level
