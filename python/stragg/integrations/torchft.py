"""torchft on stragg: ``ProcessGroupStragg``, a reconfigurable process group for the Manager.

    from torchft import Manager
    from stragg.integrations.torchft import ProcessGroupStragg

    manager = Manager(pg=ProcessGroupStragg(), min_replica_size=1, ...)

torchft's Manager keeps one process group across the replica groups and re-creates it whenever
the quorum changes (a replica died, or one joined): ``configure()`` aborts the previous stragg
backend and creates a new one on the quorum's store prefix, exactly like torchft's
``ProcessGroupGloo``. all_reduce runs on stragg's executor (shared memory on one host, TCP
across hosts); the other collectives on the stragg backend's inner Gloo (CPU) / NCCL (CUDA).

A replica that dies makes the others' pending all_reduce raise within about a second (stragg
notices a dead peer), the Manager reports the error, skips that step's commit and reconfigures
on the next quorum. ``errored()`` returns the error once the stragg backend has failed a call
(after which it is aborted), so the Manager never commits on a broken group.

``stats()`` sums stragg.backend_stats over every configuration of this process group (the
counters of one backend end when a reconfiguration replaces it).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import Work

from . import missing

try:
    from torchft.process_group import ProcessGroupWrapper
except ImportError as _err:  # pragma: no cover - depends on the environment
    raise missing("torchft", "torchft") from _err

logger = logging.getLogger("stragg")

__all__ = ["ProcessGroupStragg"]

_SUMMED = (
    "allreduce_calls",
    "allreduce_bytes",
    "barrier_calls",
    "delegated_calls",
    "failed_calls",
)


class _FutureErrorWork(Work):
    """A stragg Work whose failure travels through its future, not through wait().

    torchft's DistributedDataParallel comm hook calls ``work.wait()`` and then needs the work's
    future; when ``wait()`` raises (a peer died during the all_reduce) the Manager has no future
    to chain and the hook fails an assertion instead of skipping the step. Here ``wait()``
    records the error (``ProcessGroupStragg.errored()`` returns it) and returns; the future
    still completes with the error, which the Manager's ``wrap_future`` reports.
    """

    def __init__(self, pg: ProcessGroupStragg, work: Any) -> None:
        super().__init__()
        self._pg = pg
        self._work = work

    def wait(self, timeout: timedelta | None = None) -> bool:
        try:
            self._work.wait() if timeout is None else self._work.wait(timeout)
        except Exception as e:  # noqa: BLE001 - handed to the Manager via errored()/the future
            self._pg._record_error(e)
        return True

    def get_future(self) -> torch.futures.Future[Any]:
        return self._work.get_future()

    def is_completed(self) -> bool:
        return bool(self._work.is_completed())


class ProcessGroupStragg(ProcessGroupWrapper):
    """A reconfigurable stragg process group for torchft (model: torchft's ProcessGroupGloo).

    Args:
        timeout: timeout of the store connection and of every collective (torchft's default
            is 60 s).
    """

    def __init__(self, timeout: timedelta = timedelta(seconds=60)) -> None:
        super().__init__(timeout=timeout)
        self._backend: Any = None
        self._error: Exception | None = None
        self._totals = dict.fromkeys(_SUMMED, 0)
        self.configurations = 0

    def _create_pg(self, store: dist.Store, rank: int, world_size: int) -> dist.ProcessGroup:
        from .._registration import _create_backend

        self._retire_backend()
        self._error = None
        name = f"torchft_stragg_quorum_{self._quorum_id}_rank_{self._group_rank or 0}"
        opts = SimpleNamespace(
            store=store, group_rank=rank, group_size=world_size, timeout=self._timeout,
            group_id=name,
        )  # fmt: skip
        backend = _create_backend(opts)
        pg = dist.ProcessGroup(store, rank, world_size)
        custom = dist.ProcessGroup.BackendType.CUSTOM
        pg._set_default_backend(custom)
        pg._register_backend(torch.device("cpu"), custom, backend)
        if torch.cuda.is_available():
            pg._register_backend(torch.device("cuda"), custom, backend)
        self._backend = backend
        self.configurations += 1
        logger.info(
            "stragg: torchft quorum %s: replica rank %d of %d, transport %s",
            self._quorum_id, rank, world_size, backend.transport,
        )  # fmt: skip
        return pg

    def _retire_backend(self) -> None:
        """Adds the current backend's counters to the totals before it is replaced."""
        backend, self._backend = self._backend, None
        if backend is None:
            return
        counters = dict(backend.stats())
        for key in _SUMMED:
            self._totals[key] += int(counters.get(key, 0))

    def abort(self, errored: bool = True) -> None:
        self._retire_backend()
        super().abort(errored=errored)

    def shutdown(self) -> None:
        backend = self._backend
        self._retire_backend()
        if backend is not None:
            backend.shutdown()
        super().shutdown()

    def _wrap_work(self, work: Any, opts: object) -> Any:
        return _FutureErrorWork(self, work)

    def _record_error(self, error: Exception) -> None:
        if self._error is None:
            logger.warning("stragg: torchft quorum %s: %s", self._quorum_id, error)
            self._error = error

    def errored(self) -> Exception | None:
        if self._error is not None:
            return self._error
        backend = self._backend
        if backend is None:
            return None
        failed = int(dict(backend.stats()).get("failed_calls", 0))
        if failed:
            return RuntimeError(
                f"stragg: rank {backend.rank()} of torchft quorum {self._quorum_id}: {failed} "
                "all_reduce call(s) failed; the stragg process group is aborted"
            )
        return None

    def getBackendName(self) -> str:
        return "torchft-stragg"

    def stats(self) -> dict[str, Any]:
        """stragg's counters summed over every configuration so far, plus the current
        backend's transport and algorithm and the number of configurations."""
        out: dict[str, Any] = dict(self._totals)
        backend = self._backend
        if backend is not None:
            counters = dict(backend.stats())
            for key in _SUMMED:
                out[key] += int(counters.get(key, 0))
            out["transport"] = backend.transport
            out["algorithm"] = backend.algorithm
        out["configurations"] = self.configurations
        return out
