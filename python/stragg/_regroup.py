"""shrink_group and split_group on stragg groups: the parent backend (csrc/backend/regroup.cc)
hands torch's request here, with the recipe it was built from (_build.GroupRecipe).

Shrink: the survivors retire the parent (SHRINK_ABORT fails what runs; the default lets the
queued calls finish and tells the old group after the agreement), agree through the store on
who is excluded (each publishes its ranks_to_exclude and reads everybody else's; a survivor
found dead meanwhile, or a different list, is named at once), then build a new stragg backend
over the survivors from fresh store keys: its own transport, inner Gloo (and NCCL: the parent's
own shrink where it offers one), planner and profiler starting over for the new size.

Split: the members build a new backend over themselves from torch's store for the new group.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist

from ._attempt import incarnation_suffix
from ._build import GroupRecipe, build_backend

logger = logging.getLogger("stragg")

SHRINK_ABORT = 1
# How often a survivor waiting in the agreement looks at the store and at its peers' liveness.
_POLL_S = 0.005

T = TypeVar("T")


def regroup(recipe: GroupRecipe, parent: Any, kind: str, ranks: list[int], flags: int,
            store: Any, timeout: timedelta, group_name: str) -> Any:
    """The parent backend's Regroup callback (see stragg_backend.h): the new backend, or None
    for a split that leaves this rank out (the C++ side already returned for that case)."""
    if kind == "shrink":
        return _shrink(recipe, parent, sorted(ranks), flags)
    return _split(recipe, list(ranks), store, timeout, group_name)


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {sorted(ranks)}"


def _shrink(recipe: GroupRecipe, parent: Any, excluded: list[int], flags: int) -> Any:
    rank = recipe.rank
    where = f"stragg: rank {rank}: shrink_group"
    _check_store_survives(recipe, excluded, where)
    survivors = [r for r in range(recipe.size) if r not in excluded]
    start = time.monotonic()
    abort = bool(flags & SHRINK_ABORT)
    why = (f"shrink_group excluded {_ranks(excluded)} from group '{recipe.group_name}' "
           f"(rank {rank} shrinking it)")
    parent._retire(abort, why)
    recipe.regroups += 1  # a retry after a failed agreement meets on fresh keys
    base = dist.PrefixStore(f"stragg{recipe.attempt}/shrink{recipe.regroups}/", recipe.store)
    try:
        _agree(recipe, parent, base, excluded, survivors, where)
    finally:
        # SHRINK_DEFAULT: every survivor has finished its queued calls once the agreement holds,
        # so a call still running on an excluded rank has all it needs and is not failed.
        if not abort:
            parent._announce_retired(why)
    child = recipe.child(dist.PrefixStore("group/", base), survivors.index(rank), survivors,
                         recipe.timeout, f"{recipe.group_name}:shrunk")
    backend = _store_guard(recipe, where, lambda: build_backend(child, regroup))
    logger.info("%s: group '%s' of %d ranks -> %d (excluded %s), now rank %d, in %.3f s", where,
                recipe.group_name, recipe.size, len(survivors), excluded, child.rank,
                time.monotonic() - start)
    return backend


def _split(recipe: GroupRecipe, members: list[int], store: Any, timeout: timedelta,
           group_name: str) -> Any:
    child = recipe.child(store, members.index(recipe.rank), members, timeout,
                         group_name or f"{recipe.group_name}:split")
    child.attempt = incarnation_suffix(store, len(members))
    return build_backend(child, regroup)


def _check_store_survives(recipe: GroupRecipe, excluded: list[int], where: str) -> None:
    """The survivors meet through the group's store: refuse at once, saying why and what to do,
    when that store lives in an excluded rank's process (init_process_group's env:// / tcp://
    rendezvous makes global rank 0 its host)."""
    if not recipe.store_hosted_by_rank0:
        return
    if 0 not in [recipe.global_ranks[r] for r in excluded]:
        return
    raise RuntimeError(
        f"{where}: {recipe.store_description} lives in the process of rank 0 (the MASTER_ADDR "
        f"rendezvous makes rank 0 its host), which is in ranks_to_exclude {excluded}: with that "
        "process gone the survivors have no store to agree on a new group through. To carry on "
        "past the loss of rank 0, keep the store outside the ranks: launch with torchrun (its "
        "agent hosts the store), or create a dist.TCPStore in a process of its own and pass it "
        "as init_process_group(store=...)")


def _store_guard(recipe: GroupRecipe, where: str, fn: Callable[[], T]) -> T:
    """Runs `fn`; a failure of the store itself becomes an error that names the store."""
    try:
        return fn()
    except (dist.DistStoreError, dist.DistNetworkError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise RuntimeError(
            f"{where}: lost {recipe.store_description} while the survivors were meeting "
            f"({first}); shrink_group needs the store the group was created with to be alive"
        ) from e


def _agree(recipe: GroupRecipe, parent: Any, store: Any, excluded: list[int],
           survivors: list[int], where: str) -> None:
    """Every survivor publishes its ranks_to_exclude and waits for all others' (never for an
    excluded rank). Raises, naming the rank, when a survivor passed a different list, when an
    excluded rank takes part, when a survivor is found dead (its process or connection gone),
    or at the group's timeout."""
    mine = ",".join(str(r) for r in excluded)
    key = "agree/{}".format

    def text(value: str) -> str:
        return f"[{value.replace(',', ', ')}]"

    def check(r: int) -> str | None:
        return store.get(key(r)).decode() if store.check([key(r)]) else None

    def wait() -> None:
        store.set(key(recipe.rank), mine)
        pending = [r for r in survivors if r != recipe.rank]
        deadline = time.monotonic() + recipe.timeout.total_seconds()
        while True:
            for r in list(pending):
                theirs = check(r)
                if theirs is None:
                    continue
                if theirs != mine:
                    raise RuntimeError(
                        f"{where}: rank {r} passed ranks_to_exclude={text(theirs)} but this rank "
                        f"passed {text(mine)}: every survivor must exclude the same ranks")
                pending.remove(r)
            for r in excluded:
                theirs = check(r)
                if theirs is not None:
                    raise RuntimeError(
                        f"{where}: rank {r} is in ranks_to_exclude={text(mine)} here, but it is "
                        f"alive and shrinking too (its ranks_to_exclude={text(theirs)}): every "
                        "survivor must exclude the same ranks")
            if not pending:
                return
            gone = sorted(set(parent._gone_peers()) & set(pending))
            if gone:
                raise RuntimeError(
                    f"{where}: {_ranks(gone)} died during the shrink, before joining it; call "
                    f"shrink_group again with ranks_to_exclude={sorted(excluded + gone)}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{where}: {_ranks(pending)} did not join the shrink within "
                    f"{recipe.timeout.total_seconds():g} s (alive but not calling shrink_group "
                    f"with ranks_to_exclude={text(mine)}?)")
            time.sleep(_POLL_S)

    _store_guard(recipe, where, wait)


def install_torch_fixes() -> None:
    """Two fixes to torch 2.13's shrink_group, for stragg groups only:

    - it registers the shrunk group's backend as BackendType.GLOO on CPU whatever backend it is,
      and DDP's logger then takes a GLOO-typed backend for a ProcessGroupGloo (a crash in
      Logger::set_env_variables): stragg's is registered as torch registers it for new groups,
      BackendType.CUSTOM for cpu and cuda;
    - it removes ranks_to_exclude (group ranks) from the group's *global* ranks, so a subgroup
      whose ranks differ from the global ones gets the wrong members in torch's bookkeeping
      (get_process_group_ranks, get_global_rank): they are translated to global ranks first.
    """
    c10d = dist.distributed_c10d
    create = getattr(c10d, "_create_shrunk_process_group", None)
    finalize = getattr(c10d, "_finalize_shrunk_group", None)
    if create is None or finalize is None or getattr(create, "_stragg_fixed", False):
        return

    def is_stragg(backend: Any) -> bool:
        from . import _C

        return isinstance(backend, _C.StraggBackend)

    def create_shrunk_process_group(new_backend: Any, *args: Any, **kwargs: Any) -> Any:
        pg = create(new_backend, *args, **kwargs)
        if is_stragg(new_backend):
            custom = dist.ProcessGroup.BackendType.CUSTOM
            for device in ("cpu", "cuda"):
                pg._register_backend(torch.device(device), custom, new_backend)
            pg._set_default_backend(custom)
        return pg

    def finalize_shrunk_group(group_info: dict, excluded: set, new_backend: Any) -> Any:
        if is_stragg(new_backend):
            members = dist.get_process_group_ranks(group_info["process_group"])
            excluded = {members[r] for r in excluded}
        return finalize(group_info, excluded, new_backend)

    create_shrunk_process_group._stragg_fixed = True  # type: ignore[attr-defined]
    c10d._create_shrunk_process_group = create_shrunk_process_group
    c10d._finalize_shrunk_group = finalize_shrunk_group
