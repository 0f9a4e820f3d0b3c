"""Registers the "stragg" backend with torch.distributed and builds backend instances."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import torch.distributed as dist

from ._attempt import incarnation_suffix, restart_suffix
from ._build import GroupRecipe, build_backend
from ._config import debug_level
from ._regroup import install_torch_fixes, regroup

logger = logging.getLogger("stragg")

BACKEND_NAME = "stragg"


def _create_backend(dist_opts: Any, backend_opts: Any = None) -> Any:
    """Creator called by torch.distributed for every process group using backend "stragg".

    Builds the backend (stragg, then inner Gloo and, with CUDA and NCCL, inner NCCL) from
    prefixes of the group's store (_build.build_backend). Under torchrun every restart attempt
    uses its own prefixes (TORCHELASTIC_RESTART_COUNT), so an attempt never reads the keys a
    failed one left in the agent's store. `backend_opts` is init_process_group's / new_group's
    `pg_options`: a dict of settings or stragg.Options.
    """
    _configure_logging()

    store = dist_opts.store
    size = dist_opts.group_size
    underlying = _underlying_store(store)
    recipe = GroupRecipe(
        store=store,
        rank=dist_opts.group_rank,
        size=size,
        timeout=dist_opts.timeout,
        group_name=str(dist_opts.group_id),
        backend_opts=backend_opts,
        # Callers other than torch (stragg.integrations.torchft) may not say.
        global_ranks=list(getattr(dist_opts, "global_ranks_in_group", None) or range(size)),
        attempt=restart_suffix() + incarnation_suffix(store, size),
        store_host=_store_host(store),
        store_description=_store_description(underlying),
        store_hosted_by_rank0=_store_hosted_by_rank0(underlying),
    )
    return build_backend(recipe, regroup)


def _underlying_store(store: Any) -> Any:
    """The store behind `store`'s PrefixStores."""
    seen = 0
    while isinstance(store, dist.PrefixStore) and seen < 16:
        store = store.underlying_store
        seen += 1
    return store


def _store_host(store: Any) -> str:
    """Host of the TCPStore behind `store` (through PrefixStores), else $MASTER_ADDR, else ""."""
    store = _underlying_store(store)
    if isinstance(store, dist.TCPStore):
        return str(store.host)
    return os.environ.get("MASTER_ADDR", "").strip()


def _store_description(store: Any) -> str:
    """"the TCPStore at host:port" (or the store's type) for stragg's error messages."""
    if isinstance(store, dist.TCPStore):
        host = str(store.host)
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"the TCPStore at {host}:{store.port}"
    return f"the {type(store).__name__}"


def _store_hosted_by_rank0(store: Any) -> bool:
    """Whether rank 0's process hosts the TCPStore: torch's env:// and tcp:// rendezvous make rank
    0 the server (MASTER_ADDR), unless torchrun's agent hosts it (TORCHELASTIC_USE_AGENT_STORE).
    Stores created by the caller (init_process_group(store=...)) are not known to be."""
    if not isinstance(store, dist.TCPStore):
        return False
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "") == "True":
        return False
    return bool(os.environ.get("MASTER_ADDR", "").strip())


def _configure_logging() -> None:
    """STRAGG_DEBUG=INFO|DETAIL: show the "stragg" logger on stderr (per-call lines of DETAIL
    come from the C++ side through c10 logging: also set TORCH_CPP_LOG_LEVEL=INFO)."""
    level = debug_level()
    if not level:
        return
    logger.setLevel(logging.INFO)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)


def register() -> None:
    """Registers backend "stragg" for cpu and cuda devices. Safe to call more than once."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    install_torch_fixes()
    dist.Backend.register_backend(
        BACKEND_NAME, _create_backend, extended_api=True, devices=["cpu", "cuda"]
    )


def is_registered() -> bool:
    return BACKEND_NAME.upper() in dist.Backend._plugins


def _stragg_backend(group: dist.ProcessGroup | None) -> Any:
    from . import _C

    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    backend = pg._get_backend(torch.device("cpu"))
    if not isinstance(backend, _C.StraggBackend):
        raise TypeError(
            f"stragg: the process group uses backend {pg.name()!r}, not {BACKEND_NAME!r}"
        )
    return backend


# The C++ counters name each peer's transport as "peer_transport.<rank>": 1 (shm) or 2 (tcp)
# (csrc/transport/mixed/peer_stats.h).
_PEER_TRANSPORT = "peer_transport."
_PEER_TRANSPORT_NAMES = {1: "shm", 2: "tcp"}


def backend_stats(group: dist.ProcessGroup | None = None) -> dict[str, Any]:
    """Counters of the stragg backend of `group` (default: the default group).

    Keys: "transport" ("shm", "tcp", "mixed" where some ranks share a host and others are
    remote, "local" for world size 1, or "gloo" when all_reduce is delegated),
    "peer_transports" ({peer rank: "shm" or "tcp"}, what carries this rank's messages to each
    peer; empty without a stragg transport), "shm_peers" / "tcp_peers" (their counts; "mixed"
    adds "host_index", "hosts" and "relayed_wakeups"), "algorithm", "straggler",
    "allreduce_calls" and "allreduce_bytes" (all_reduces run on stragg's executor),
    "barrier_calls" (stragg's own barriers), "delegated_calls" (operations passed to the inner
    Gloo/NCCL backend), "failed_calls", timing totals, "streamed_bytes" (bytes received by
    copies with non-temporal stores, STRAGG_STREAMING_BYTES), and from the last link probe:
    "degraded_ranks" ({rank: slowdown factor l}), "links" (per rank: send/recv bytes/s,
    slowdown) and "link_matrix" (n x n [alpha_s, beta_s_per_byte] of the directed links, None
    unmeasured).
    """
    backend = _stragg_backend(group)
    stats: dict[str, Any] = dict(backend.stats())
    peers = {}
    for key in [k for k in stats if k.startswith(_PEER_TRANSPORT)]:
        peers[int(key[len(_PEER_TRANSPORT):])] = _PEER_TRANSPORT_NAMES[stats.pop(key)]
    stats["peer_transports"] = dict(sorted(peers.items()))
    stats["transport"] = backend.transport
    stats["algorithm"] = backend.algorithm
    straggler = backend.straggler  # a rank, "auto" (profiler), "dynamic" or "none"
    stats["straggler"] = int(straggler) if straggler.isdigit() else straggler
    links = backend.link_analysis()
    stats["degraded_ranks"] = dict(links["degraded"])
    stats["links"] = links["ranks"]
    stats["link_matrix"] = [[None if v is None else list(v) for v in row]
                            for row in backend.link_matrix()]
    return stats


def recent_calls(group: dist.ProcessGroup | None = None) -> list[dict[str, Any]]:
    """The last (up to 1024) all_reduce calls of `group` on this rank, oldest first.

    Each entry: seq, numel, bytes, algorithm, plan (the algorithm with its parameters, e.g.
    "optcc(3=2,k=16)", "host:ring" for a host-level plan), predicted_s (the cost model's time
    from the last rank's arrival, before measured corrections; 0 if none), straggler (configured or
    agreed, -1 none),
    queued_s (call to start), agreement_s (dynamic straggler agreement), run_s (executing the
    schedule), wait_s (of run_s, blocked on peers), pre_arrival_s (of run_s, in steps without the
    straggler), ok.
    """
    return list(_stragg_backend(group).recent_calls())
