"""DDP communication hook that all_reduces gradient buckets through a stragg process group.

Use it when the model's DistributedDataParallel runs on another backend (Gloo, NCCL) but the
gradient all_reduce should run on stragg::

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import stragg.ddp

    dist.init_process_group(backend="gloo")          # or "nccl"
    model = DDP(MyModel())
    state = stragg.ddp.register(model)               # collective: call it on every rank
    # ... train as usual; every gradient bucket is averaged by stragg's all_reduce
    print(stragg.backend_stats(state.process_group)["allreduce_calls"])

or, spelled out::

    state = stragg.ddp.StraggHookState()             # collective: creates the stragg group
    model.register_comm_hook(state, stragg.ddp.allreduce_hook)

The arithmetic mirrors DDP without a hook: each bucket is multiplied by ``1 / group size``
(DDP's reducer scales gradients the same way, with a float reciprocal, not a division) and then
summed with all_reduce. So results equal plain DDP up to the summation order of the reduction
(bitwise for two ranks), and every rank ends with bitwise identical gradients. CUDA buckets work
the same way: a stragg group hands CUDA all_reduce to its inner NCCL backend.
"""

# No `from __future__ import annotations` here (hence the FA100 noqa's below):
# DistributedDataParallel.register_comm_hook compares the hook's real annotations with
# dist.GradBucket and torch.futures.Future[torch.Tensor] and rejects strings.
import logging
from typing import Any, Optional

import torch
import torch.distributed as dist

from ._registration import BACKEND_NAME

logger = logging.getLogger("stragg")

__all__ = ["StraggHookState", "allreduce_hook", "register"]


def _uses_stragg(group: dist.ProcessGroup) -> bool:
    """Whether ``group`` was created with a backend string naming stragg (any device)."""
    try:
        name = str(dist.get_backend(group))
    except Exception:  # noqa: BLE001 - a group unknown to c10d's registry
        name = str(group.name())
    return BACKEND_NAME in name.lower()


class StraggHookState:
    """State of :func:`allreduce_hook`: the stragg process group the buckets are reduced on.

    Args:
        process_group: a process group whose backend is stragg (e.g. from
            ``dist.new_group(ranks, backend="stragg")``), spanning the same ranks as the DDP
            model's process group. ``None`` (default): the default group itself when its
            backend is ``"stragg"``, otherwise a new stragg group over all ranks of the default
            group, created here with ``dist.new_group(backend="stragg")``.

    Creating the state with ``process_group=None`` is a **collective** call: every rank of the
    default group must construct it, in the same order relative to other ``new_group`` calls
    (like ``dist.new_group`` itself), or the ranks block until the process-group timeout.

    Raises:
        RuntimeError: torch.distributed is not initialized.
        ValueError: ``process_group`` does not use the stragg backend, or this rank is not a
            member of it.

    Example::

        state = stragg.ddp.StraggHookState()                       # on every rank
        ddp_model.register_comm_hook(state, stragg.ddp.allreduce_hook)
    """

    def __init__(self, process_group: Optional[dist.ProcessGroup] = None) -> None:  # noqa: FA100
        if not dist.is_initialized():
            raise RuntimeError(
                "stragg.ddp: torch.distributed is not initialized; call "
                "dist.init_process_group() first"
            )
        if process_group is None:
            default = dist.distributed_c10d._get_default_group()
            if _uses_stragg(default):
                process_group = default
            else:
                process_group = dist.new_group(backend=BACKEND_NAME)
                logger.info(
                    "stragg.ddp: created a stragg process group over the %d ranks of the "
                    "default group (backend %s) for the DDP hook",
                    default.size(),
                    dist.get_backend(default),
                )
        if process_group is None or process_group == dist.GroupMember.NON_GROUP_MEMBER:
            raise ValueError("stragg.ddp: this rank is not a member of the given process group")
        if not _uses_stragg(process_group):
            raise ValueError(
                f"stragg.ddp: the process group uses backend {dist.get_backend(process_group)!r},"
                f" not {BACKEND_NAME!r}; create one with dist.new_group(backend={BACKEND_NAME!r})"
            )
        self.process_group: dist.ProcessGroup = process_group
        self.world_size: int = process_group.size()

    def __repr__(self) -> str:
        return (
            f"StraggHookState(process_group={self.process_group.group_name!r}, "
            f"world_size={self.world_size})"
        )


def allreduce_hook(
    state: StraggHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: average the gradient bucket with stragg's all_reduce.

    Scales ``bucket.buffer()`` in place by ``1 / group size`` (like DDP's reducer does without a
    hook; scaling first also keeps float16 sums from overflowing), then all_reduces it with
    ``SUM`` asynchronously on ``state.process_group``. Returns the future of the all_reduce,
    resolved to the averaged bucket tensor, as ``register_comm_hook`` requires. Works for CPU
    and CUDA buckets (stragg hands CUDA to NCCL).

    Example::

        state = stragg.ddp.StraggHookState()
        ddp_model.register_comm_hook(state, stragg.ddp.allreduce_hook)
    """
    group = state.process_group
    tensor = bucket.buffer()
    size = state.world_size
    if size > 1:
        # DDP's reducer multiplies by the reciprocal (a double scalar), which differs from
        # div_(size) in the last bit for sizes that are not powers of two.
        tensor.mul_(1.0 / size)
    work = dist.all_reduce(tensor, group=group, async_op=True)
    return work.get_future().then(_first_value)


def _first_value(fut: torch.futures.Future[Any]) -> torch.Tensor:
    value = fut.value()
    return value[0] if isinstance(value, (list, tuple)) else value


def register(
    model: torch.nn.parallel.DistributedDataParallel,
    process_group: Optional[dist.ProcessGroup] = None,  # noqa: FA100
) -> StraggHookState:
    """Register :func:`allreduce_hook` on a DistributedDataParallel ``model``; return its state.

    ``process_group`` is passed to :class:`StraggHookState` (``None``: a stragg group over all
    ranks of the default group, created collectively, so call this on every rank). Register
    before the first backward; DDP accepts only one communication hook per model.

    Raises:
        TypeError: ``model`` is not a ``torch.nn.parallel.DistributedDataParallel``.

    Example::

        model = DDP(net)                       # default group "gloo" or "nccl"
        state = stragg.ddp.register(model)     # gradients now all_reduced by stragg
    """
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        raise TypeError(
            "stragg.ddp.register: expected a torch.nn.parallel.DistributedDataParallel model, "
            f"got {type(model).__module__}.{type(model).__qualname__}; wrap it first: "
            "model = DistributedDataParallel(model)"
        )
    state = StraggHookState(process_group)
    ddp_group = getattr(model, "process_group", None)
    if ddp_group is not None:
        try:
            ddp_ranks = dist.get_process_group_ranks(ddp_group)
            hook_ranks = dist.get_process_group_ranks(state.process_group)
        except Exception:  # noqa: BLE001 - informational check only
            ddp_ranks = hook_ranks = []
        if ddp_ranks != hook_ranks:
            logger.warning(
                "stragg.ddp: the DDP model's process group spans ranks %s but the stragg hook "
                "group spans %s; gradients are averaged over the hook group only",
                ddp_ranks,
                hook_ranks,
            )
    model.register_comm_hook(state, allreduce_hook)
    return state
