"""accelerate and the transformers Trainer on stragg: one call, before they are built.

    import stragg.integrations.hf
    stragg.integrations.hf.use_stragg()              # before Accelerator() / TrainingArguments()

    accelerator = Accelerator(cpu=True)              # CPU ranks (GPU ranks: Accelerator())
    model, opt, data = accelerator.prepare(model, opt, data)   # DDP on a stragg process group
    # or: Trainer(model, TrainingArguments(..., use_cpu=True), ...).train()

Launch as usual (`torchrun --nproc-per-node N script.py` or `accelerate launch`). What
:func:`use_stragg` changes, for this process:

- accelerate chooses the backend of the process group it creates: on CPU it always takes "gloo"
  and rejects any other name (``ValueError: Your assigned backend stragg is not available,
  please use gloo``), on GPUs "nccl". After ``use_stragg()`` a distributed job on CPU or GPU
  (accelerate's MULTI_CPU / MULTI_GPU) gets ``backend`` (default ``"stragg"``: stragg's
  all_reduce, Gloo/NCCL for the rest) when no backend was asked for, and a stragg backend asked
  for explicitly is accepted: ``InitProcessGroupKwargs(backend="stragg")``,
  ``TrainingArguments(ddp_backend="stragg")`` and the Trainer's ``--ddp_backend stragg``.
  Other backend names and other accelerators (XLA, NPU, ...) are left to accelerate.
- ``Accelerator.prepare_model`` (also used by the Trainer) warns with
  :class:`ModelNotWrappedWarning` when the job runs several processes, or a stragg group
  exists, but the model was not wrapped in DistributedDataParallel: then its gradients are never
  synchronised and stragg carries no all_reduce. The common cause is a host without GPUs and
  ``cpu=False`` / ``use_cpu=False``: accelerate then trains every process on its own.

:class:`StragglerReportCallback` (:func:`add_straggler_report`) logs per-rank lateness and the
straggler verdict (:func:`stragg.straggler_report`) to the Trainer's loggers every N steps.

:func:`restore` undoes both (tests). Call ``use_stragg()`` before accelerate's state exists: a
state already set up on another backend raises ``RuntimeError``.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import warnings
from typing import Any

import torch.distributed as dist

from .._registration import BACKEND_NAME
from . import missing
from ._report import PeriodicReport, ReportAccess

try:
    import accelerate.accelerator as _acc_module
    import accelerate.state as _state_module
    from accelerate.utils import DistributedType
except ImportError as _err:  # pragma: no cover - depends on the environment
    raise missing("hf", "accelerate") from _err

logger = logging.getLogger("stragg")

__all__ = [
    "ModelNotWrappedWarning",
    "StragglerReportCallback",
    "add_straggler_report",
    "is_active",
    "restore",
    "use_stragg",
]

_DISTRIBUTED = (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU)
_originals: dict[str, Any] = {}
_backend: str = BACKEND_NAME


class ModelNotWrappedWarning(UserWarning):
    """A distributed job (or a stragg group) whose model accelerate did not wrap in DDP."""


def _is_stragg(name: Any) -> bool:
    return isinstance(name, str) and BACKEND_NAME in name.lower()


def _prepare_backend(self: Any, cpu: bool = False, sagemaker_dp: bool = False, backend: Any = None):
    """accelerate's PartialState._prepare_backend, choosing stragg for MULTI_CPU / MULTI_GPU."""
    original = _originals["_prepare_backend"]
    asked = backend
    chosen, dist_type = original(self, cpu, sagemaker_dp, None if _is_stragg(asked) else asked)
    if dist_type in _DISTRIBUTED and (asked is None or _is_stragg(asked)):
        chosen = asked or _backend
    elif _is_stragg(asked):
        raise ValueError(
            f"stragg.integrations.hf: backend {asked!r} needs a distributed CPU or CUDA job, but "
            f"accelerate set up {dist_type} (world size "
            f"{os.environ.get('WORLD_SIZE', '1')}); launch with torchrun / accelerate launch, "
            "and pass cpu=True (use_cpu=True) on a host without GPUs"
        )
    return chosen, dist_type


def _stragg_groups() -> list[Any]:
    if not dist.is_available() or not dist.is_initialized():
        return []
    groups = []
    for pg in list(dist.distributed_c10d._world.pg_map):
        try:
            if _is_stragg(str(dist.get_backend(pg))):
                groups.append(pg)
        except Exception:  # noqa: BLE001,S112 - a group being torn down: not ours to judge
            continue
    return groups


def _check_wrapped(accelerator: Any, model: Any) -> None:
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        return
    if not any(p.requires_grad for p in model.parameters()):
        return
    dist_type = accelerator.distributed_type
    if dist_type not in (DistributedType.NO, *_DISTRIBUTED):
        return  # FSDP, DeepSpeed, ...: their own wrappers
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    groups = _stragg_groups()
    if world <= 1 and not groups:
        return
    rank = os.environ.get("RANK", "?")
    reason = f"a stragg process group exists ({len(groups)})" if groups else f"WORLD_SIZE={world}"
    hint = ""
    if dist_type == DistributedType.NO:
        hint = (
            " accelerate set up no distributed training (distributed_type NO): on a host "
            "without GPUs pass cpu=True to Accelerator (use_cpu=True to TrainingArguments)."
        )
    message = (
        f"stragg: rank {rank}: {reason}, but accelerate did not wrap the model in "
        "DistributedDataParallel: its gradients are NOT synchronised across processes and "
        f"stragg carries no all_reduce.{hint}"
    )
    logger.warning(message)
    warnings.warn(message, ModelNotWrappedWarning, stacklevel=4)


def _prepare_model(self: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
    result = _originals["prepare_model"](self, model, *args, **kwargs)
    evaluation = kwargs.get("evaluation_mode", args[1] if len(args) > 1 else False)
    if not evaluation:
        _check_wrapped(self, result)
    return result


def _allow_cli_choice(name: str) -> None:
    """Adds `name` to TrainingArguments' ddp_backend choices (HfArgumentParser, --ddp_backend)."""
    if importlib.util.find_spec("transformers") is None:
        return
    from transformers import training_args

    field = training_args.TrainingArguments.__dataclass_fields__.get("ddp_backend")
    choices = None if field is None else field.metadata.get("choices")
    if isinstance(choices, list) and name not in choices:
        choices.append(name)


def use_stragg(backend: str = BACKEND_NAME) -> None:
    """Make accelerate (and so the transformers Trainer) run distributed jobs on stragg.

    Args:
        backend: the backend string for the process group, naming stragg: ``"stragg"``
            (default, CPU and CUDA tensors on stragg's backend) or e.g.
            ``"cpu:stragg,cuda:nccl"``.

    Call it once per process before ``Accelerator()`` / ``TrainingArguments()``; calling it
    again changes the backend. Raises ValueError for a backend that is not stragg's, and
    RuntimeError when accelerate's state already exists on another backend.
    """
    global _backend
    if not _is_stragg(backend):
        raise ValueError(
            f"stragg.integrations.hf.use_stragg: backend={backend!r} does not name stragg "
            "(e.g. 'stragg' or 'cpu:stragg,cuda:nccl')"
        )
    state = _state_module.PartialState._shared_state
    if state and state.get("backend") is not None and not _is_stragg(state.get("backend")):
        raise RuntimeError(
            "stragg.integrations.hf.use_stragg: accelerate's state is already set up on backend "
            f"{state.get('backend')!r}; call use_stragg() before creating Accelerator, "
            "PartialState or TrainingArguments"
        )
    import stragg  # noqa: F401  registers the backend (also autoloaded by torch)

    _backend = backend
    if not _originals:
        partial = _state_module.PartialState
        accelerator = _acc_module.Accelerator
        _originals["_prepare_backend"] = partial._prepare_backend
        _originals["prepare_model"] = accelerator.prepare_model
        partial._prepare_backend = _prepare_backend
        accelerator.prepare_model = functools.wraps(_originals["prepare_model"])(_prepare_model)
    _allow_cli_choice(BACKEND_NAME)
    if backend != BACKEND_NAME:
        _allow_cli_choice(backend)


def is_active() -> bool:
    """Whether use_stragg() is in effect."""
    return bool(_originals)


def restore() -> None:
    """Undo use_stragg(): accelerate's own backend choice and prepare_model again."""
    if not _originals:
        return
    _state_module.PartialState._prepare_backend = _originals.pop("_prepare_backend")
    _acc_module.Accelerator.prepare_model = _originals.pop("prepare_model")


try:
    from transformers import TrainerCallback as _TrainerCallback
except ImportError:  # pragma: no cover - accelerate without transformers
    _TrainerCallback = object


class StragglerReportCallback(ReportAccess, _TrainerCallback):  # type: ignore[misc, valid-type]
    """A transformers ``TrainerCallback`` that logs per-rank lateness and the straggler verdict
    every ``every_n_steps`` optimizer steps.

        trainer = Trainer(model, args, ...)
        stragg.integrations.hf.add_straggler_report(trainer, every_n_steps=50)

    Each report is ``stragg.straggler_report(group)`` (default: the default group) as
    :func:`stragg.straggler.report_metrics` (``stragg/straggler``,
    ``stragg/rank<r>/lateness_p50_ms``, ``.../lateness_ewma_ms``, ``.../share_last``,
    ``.../score``, ``.../verdict``: 0 none, 1 transient, 2 chronic), passed to ``trainer.log``
    (so every ``report_to`` integration and ``state.log_history`` get it) when the callback knows
    the trainer (:func:`add_straggler_report`, or ``trainer=``); without it the metrics are
    appended to ``state.log_history``. Every report also logs one INFO line (logger "stragg").
    ``sync=True`` adds a stragg barrier per report so every rank's report is identical.
    ``history`` holds (step, metrics) per report, ``last_report`` the latest StragglerReport. A
    group that is not stragg, or whose profiler is off, raises when training starts.
    """

    def __init__(
        self,
        every_n_steps: int = 50,
        group: dist.ProcessGroup | None = None,
        sync: bool = False,
        trainer: Any = None,
    ) -> None:
        if _TrainerCallback is object:
            raise missing("hf", "transformers")
        self._periodic = PeriodicReport("StragglerReportCallback", every_n_steps, group, sync)
        self.trainer = trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._periodic.check(self._periodic.group)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = int(state.global_step)
        metrics = self._periodic.take(step, self._periodic.group)
        if metrics is None:
            return
        if self.trainer is not None:
            # trainer.log's on_log clears control.should_log: restore it, or the step's own log
            # (the loss) set by DefaultFlowCallback would be skipped.
            should_log = control.should_log
            self.trainer.log(dict(metrics))
            control.should_log = should_log
            self.trainer.control.should_log = should_log
        else:
            state.log_history.append({**metrics, "step": step})


def add_straggler_report(
    trainer: Any,
    every_n_steps: int = 50,
    group: dist.ProcessGroup | None = None,
    sync: bool = False,
) -> StragglerReportCallback:
    """Adds a :class:`StragglerReportCallback` that logs through ``trainer.log``; returns it."""
    callback = StragglerReportCallback(every_n_steps, group=group, sync=sync, trainer=trainer)
    trainer.add_callback(callback)
    return callback
