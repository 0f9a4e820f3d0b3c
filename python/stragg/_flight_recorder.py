"""torch's flight recorder sees stragg's collectives.

With ``TORCH_FR_BUFFER_SIZE=N`` (N > 0) in the environment, stragg records its collectives (its
own all_reduce and barrier, and those it delegates to Gloo/NCCL) in a ring buffer of N entries, in
the schema of torch's flight recorder (backend/flight_recorder.h). torch's own recorder cannot be
written from an extension (its instance is not exported from libtorch), so when the first stragg
group is created, ``torch._C._distributed_c10d._dump_fr_trace`` is wrapped: what it returns
(torch's pickled dump) gets stragg's entries, groups and status added. torch's own entries stay,
except those of stragg's unnamed inner Gloo backends (stragg records those collectives under its
own group). Each stragg entry carries a ``"stragg"`` dict: its call number, the error that ended
it (naming the late or dead rank), the plan, algorithm and straggler of the call.

With ``TORCH_FR_DUMP_TEMP_FILE=<prefix>`` too, the first failed collective of a process (timeout,
peer found dead) writes that dump to ``<prefix><global rank>``, as ProcessGroupNCCL does on a
timeout, so ``python -m torch.distributed.flight_recorder.fr_trace <dir> --prefix <name>``
(``--allow-incomplete-ranks`` when a rank died or hangs) reads every surviving rank's.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

__all__ = ["buffer_size", "install_dump_hook", "dump"]


def buffer_size() -> int:
    """TORCH_FR_BUFFER_SIZE as torch reads it (0 when unset or not a positive number)."""
    try:
        return max(0, int(os.environ.get("TORCH_FR_BUFFER_SIZE", "0") or "0"))
    except ValueError:
        return 0


def _flag(value: Any, default: bool) -> bool:
    return default if value is None else bool(value)


def install_dump_hook() -> None:
    """Wraps torch._C._distributed_c10d._dump_fr_trace so that its dump includes stragg's entries.

    Idempotent; called by the backend creator when the recorder is on.
    """
    c10d = torch._C._distributed_c10d
    original = getattr(c10d, "_dump_fr_trace", None)
    if original is None or getattr(original, "_stragg_wrapped", False):
        return

    @functools.wraps(original)
    def _dump_fr_trace(
        includeCollectives: bool | None = None,
        includeStackTraces: bool | None = None,
        onlyActive: bool | None = None,
    ) -> bytes:
        data = original(includeCollectives, includeStackTraces, onlyActive)
        from . import _C

        return _C._fr_merge_dump(
            data, _flag(includeCollectives, True), _flag(onlyActive, False)
        )

    _dump_fr_trace._stragg_wrapped = True  # type: ignore[attr-defined]
    c10d._dump_fr_trace = _dump_fr_trace


def dump() -> bytes:
    """This process's flight-recorder dump, torch's entries and stragg's, pickled (what the
    wrapped ``_dump_fr_trace()`` returns)."""
    install_dump_hook()
    return torch._C._distributed_c10d._dump_fr_trace()
