"""The store-key suffix of one attempt at creating a group (GroupRecipe.attempt): torchrun
restarts and re-creations of a group on the same store each meet under fresh keys. Used by the
creator (_registration) and by split_group (_regroup)."""

from __future__ import annotations

import os
from typing import Any


def restart_suffix() -> str:
    """"" normally; "/restart<N>" in a torchrun worker restarted N > 0 times (the agent's store
    outlives the attempts, and with it every key a failed attempt wrote)."""
    count = os.environ.get("TORCHELASTIC_RESTART_COUNT", "").strip()
    return f"/restart{count}" if count.isdigit() and int(count) > 0 else ""


def incarnation_suffix(store: Any, size: int) -> str:
    """"" for the first group created on this store under this name; "/i<k>" for the k-th
    re-creation (destroy_process_group() then init_process_group() on the same store: torch
    reuses the group's store prefix, and the earlier group's setup keys are still there). Every
    rank adds 1 to one counter: the ranks of one incarnation read values k*size+1..(k+1)*size,
    since no rank can start the next one before all have joined this one."""
    count = int(store.add("stragg_incarnations", 1))
    k = (count - 1) // max(1, size)
    return f"/i{k}" if k > 0 else ""
