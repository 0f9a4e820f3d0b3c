"""Builds a stragg backend from a GroupRecipe: what torch's creator call, shrink_group and
split_group all end in (the stragg backend first, then its inner Gloo / NCCL backends)."""

from __future__ import annotations

import dataclasses
import logging
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ._config import raw_settings

logger = logging.getLogger("stragg")


@dataclasses.dataclass
class GroupRecipe:
    """How a group's backend was made: enough to make a shrunk or split child the same way."""

    store: Any  # the store the group's keys live under (stragg adds its own prefixes)
    rank: int
    size: int
    timeout: timedelta
    group_name: str
    backend_opts: Any  # init_process_group's / new_group's pg_options (settings)
    global_ranks: list[int]  # the members' ranks in the default group
    attempt: str  # "" or "/restart<N>" (torchrun restarts) + "/i<k>" (re-creations)
    store_host: str
    store_description: str
    store_hosted_by_rank0: bool
    regroups: int = 0  # shrink / split attempts made from this group (fresh keys for each)

    def child(self, store: Any, rank: int, members: list[int], timeout: timedelta,
              group_name: str) -> GroupRecipe:
        """The recipe of a group of `members` (this group's ranks) with its own `store`."""
        return dataclasses.replace(
            self,
            store=store,
            rank=rank,
            size=len(members),
            timeout=timeout,
            group_name=group_name,
            global_ranks=[self.global_ranks[m] for m in members],
            attempt="",
            regroups=0,
        )


def build_backend(recipe: GroupRecipe) -> Any:
    """Collective over the recipe's ranks: the stragg backend (its setup names ranks that never
    join), then the inner Gloo backend (CPU collectives other than all_reduce) and, when CUDA
    and NCCL are available, an inner NCCL backend (CUDA collectives), all from prefixes of the
    recipe's store."""
    from . import _C  # the C++ extension is loaded only when a group is really created
    from ._regroup import regroup

    store, rank, size, timeout, attempt = (
        recipe.store, recipe.rank, recipe.size, recipe.timeout, recipe.attempt)
    backend = _C.StraggBackend(
        dist.PrefixStore("stragg" + attempt, store),
        rank,
        size,
        timeout,
        recipe.group_name,
        raw_settings(recipe.backend_opts),
        recipe.store_host,
        store_description=recipe.store_description,
        store_hosted_by_rank0=recipe.store_hosted_by_rank0,
    )
    # The members' global ranks: the flight recorder's group and the profiler trace's group_ranks.
    backend._set_flight_recorder_ranks(list(recipe.global_ranks))
    if _C._fr_enabled():
        # torch's flight recorder (TORCH_FR_BUFFER_SIZE): stragg's entries in its dumps.
        from ._flight_recorder import install_dump_hook

        install_dump_hook()
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo" + attempt, store), rank, size, timeout)
    backend._attach_inner("cpu", gloo)
    if torch.cuda.is_available() and dist.is_nccl_available():
        nccl_opts = dist.ProcessGroupNCCL.Options()
        nccl_opts._timeout = timeout
        nccl = dist.ProcessGroupNCCL(
            dist.PrefixStore("nccl" + attempt, store), rank, size, nccl_opts
        )
        backend._attach_inner("cuda", nccl)
    # The recipe, not the backend, is captured: the callback holds no reference cycle.
    backend._set_regroup(lambda *request: regroup(recipe, *request))
    logger.info(
        "stragg: rank %d/%d of group %s: all_reduce via %s transport, algorithm %s, straggler %s",
        rank,
        size,
        recipe.group_name,
        backend.transport,
        backend.algorithm,
        backend.straggler,
    )
    return backend
