"""Builds a stragg backend from a GroupRecipe: what torch's creator call, shrink_group and
split_group all end in (the stragg backend first, then its inner Gloo / NCCL backends).

A rank that dies while the others are still setting up makes every other rank raise within the
group's timeout, naming it. stragg's own setup waits at most the timeout for each record (the C++
rendezvous names who never joined); the inner Gloo backend is bounded here (_InnerSetup): Gloo
waits five times its timeout for a pair's first connection (gloo/transport/tcp/pair.h: "a longer
timeout when waiting for initial connect"), so a peer that dies after publishing its address
would hold ProcessGroupGloo's constructor 5 x the group's timeout (seen: 180 s and counting with a
60 s timeout). The ranks meet before it (every rank is there, so Gloo's own store waits are
short), build it with a fifth of the timeout, restore the full timeout for its collectives, and
meet again after it; a meeting notices a dead peer at once (the stragg transport's gone_peers),
and a rank whose Gloo setup fails publishes why, so every survivor reports the same cause.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import timedelta
from functools import partial
from typing import Any, Callable

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


def build_backend(recipe: GroupRecipe, regroup: Callable[..., Any]) -> Any:
    """Collective over the recipe's ranks: the stragg backend (its setup names ranks that never
    join), then the inner Gloo backend (CPU collectives other than all_reduce) and, when CUDA
    and NCCL are available, an inner NCCL backend (CUDA collectives), all from prefixes of the
    recipe's store. `regroup(recipe, *request)` answers the backend's shrink / split requests
    (_regroup.regroup, passed in by the layer above: this module imports neither caller)."""
    from . import _C  # the C++ extension is loaded only when a group is really created

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
        store_hosted_by_rank0=_rank0_may_wait_for_workers(recipe),
    )
    # The members' global ranks: the flight recorder's group and the profiler trace's group_ranks.
    backend._set_flight_recorder_ranks(list(recipe.global_ranks))
    if _C._fr_enabled():
        # torch's flight recorder (TORCH_FR_BUFFER_SIZE): stragg's entries in its dumps.
        from ._flight_recorder import install_dump_hook

        install_dump_hook()
    setup = _InnerSetup(dist.PrefixStore("stragg_inner" + attempt, store), rank, size, timeout,
                        backend._gone_peers, recipe.store_description)  # fmt: skip
    gloo = setup.build_gloo(dist.PrefixStore("gloo" + attempt, store))
    backend._attach_inner("cpu", gloo)
    if torch.cuda.is_available() and dist.is_nccl_available():
        nccl_opts = dist.ProcessGroupNCCL.Options()
        nccl_opts._timeout = timeout
        nccl = dist.ProcessGroupNCCL(
            dist.PrefixStore("nccl" + attempt, store), rank, size, nccl_opts
        )
        backend._attach_inner("cuda", nccl)
    setup.meet("done")  # init returns on a rank only once every rank got this far
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


def _rank0_may_wait_for_workers(recipe: GroupRecipe) -> bool:
    """What the C++ setup's Rendezvous::hosted_by_rank0 means: rank 0 of this group hosts the
    store and may still be inside torch's TCPStore, waiting for every process to connect. Only
    the default group's creation (init_process_group: no default group yet) with global rank 0
    as the group's rank 0; later groups' rank 0 is long past that wait."""
    return (
        recipe.store_hosted_by_rank0
        and recipe.global_ranks[:1] == [0]
        and not dist.is_initialized()
    )


# Gloo's initial connect waits this many times its context's timeout (gloo/transport/tcp/pair.h).
_GLOO_CONNECT_FACTOR = 5
_POLL_S = (0.001, 0.05)  # first and longest pause between looks at the store


class _InnerSetup:
    """The ranks' meetings around the inner backends' creation (see the module docstring): each
    publishes `<stage>/<rank>` and waits for everyone's, raising DistBackendError at once when a
    peer that has not arrived is dead (its process or connection gone) or a rank published why
    its setup failed, and at the timeout naming the ranks that did not arrive."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta,
                 gone_peers: Callable[[], list[int]], store_description: str) -> None:
        self.store, self.rank, self.size, self.timeout = store, rank, size, timeout
        self.gone_peers = gone_peers
        self.store_description = store_description

    def _head(self, what: str) -> str:
        return f"stragg: rank {self.rank}: process group setup ({what})"

    def _store(self, fn: Callable[[], Any], what: str) -> Any:
        try:
            return fn()
        except (dist.DistStoreError, dist.DistNetworkError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise dist.DistStoreError(
                f"{self._head(what)}: lost {self.store_description}: {first}"
            ) from exc

    def _published_failure(self) -> str | None:
        if not self.store.check(["failed"]):
            return None
        return bytes(self.store.get("failed")).decode(errors="replace")

    def _publish_failure(self, cause: str) -> str:
        """Publishes this rank's cause unless a rank published one first; returns what to
        report: ": <cause>" (this rank's) or " failed on rank R: <cause>" (the first one's)."""
        mine = f"on rank {self.rank}: {cause}"
        try:
            first = bytes(self.store.compare_set("failed", "", mine)).decode(errors="replace")
        except (dist.DistStoreError, dist.DistNetworkError, RuntimeError):
            first = mine  # the store is gone too: this rank's own view
        return f": {cause}" if first in ("", mine) else f" failed {first}"

    def _absent(self, keys: list[str], ranks: list[int], what: str) -> list[int]:
        """Those of `ranks` whose key is not in the store."""
        return [r for r in ranks if not self._store(partial(self.store.check, [keys[r]]), what)]

    def meet(self, stage: str) -> None:
        """Every rank reaches `stage`, or this rank raises naming who did not (and why)."""
        if self.size == 1:
            return
        what = "the inner Gloo backend" if stage == "gloo" else "the inner backends"
        keys = [f"{stage}/{r}" for r in range(self.size)]
        self._store(lambda: self.store.set(keys[self.rank], "1"), what)
        deadline = time.monotonic() + self.timeout.total_seconds()
        pause = _POLL_S[0]
        while True:
            if self._store(lambda: self.store.check(keys), what):
                return
            failure = self._store(self._published_failure, what)
            if failure is not None:
                raise dist.DistBackendError(f"{self._head(what)} failed {failure}")
            dead = self._absent(keys, sorted(set(self.gone_peers()) - {self.rank}), what)
            if dead:
                raise dist.DistBackendError(f"{self._head(what)}: {_died(dead)}")
            if time.monotonic() >= deadline:
                missing = self._absent(keys, list(range(self.size)), what)
                if not missing:
                    return  # the last one arrived just now
                raise dist.DistBackendError(
                    f"{self._head(what)} timed out after {self.timeout.total_seconds():g} s: "
                    f"{_ranks(missing)} did not get there"
                )
            time.sleep(pause)
            pause = min(2 * pause, _POLL_S[1])

    def build_gloo(self, store: Any) -> Any:
        """ProcessGroupGloo over `store`, its setup bounded by the group's timeout."""
        self.meet("gloo")
        connect_timeout = max(self.timeout / _GLOO_CONNECT_FACTOR, timedelta(milliseconds=1))
        what = "the inner Gloo backend"
        try:
            gloo = dist.ProcessGroupGloo(store, self.rank, self.size, connect_timeout)
        except Exception as exc:  # every failure is reported, with its cause
            dead = [r for r in self.gone_peers() if r != self.rank]
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if dead:
                cause = _died(dead)
            else:
                cause = f"Gloo failed ({first}); no peer is known to have died"
            raise dist.DistBackendError(self._head(what) + self._publish_failure(cause)) from exc
        gloo.set_timeout(self.timeout)  # its collectives wait the group's timeout
        return gloo


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {sorted(ranks)}"


def _died(ranks: list[int]) -> str:
    verb = "has" if len(ranks) == 1 else "have"
    return f"{_ranks(ranks)} {verb} died (process or connection gone)"
