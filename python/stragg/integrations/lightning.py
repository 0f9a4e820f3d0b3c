"""Lightning strategies that train on stragg.

    import stragg.integrations.lightning       # registers the strategy names below
    trainer = Trainer(accelerator="cpu", devices=4, strategy="ddp_stragg")

- ``"ddp_stragg"`` (:class:`DDPStraggStrategy`): Lightning's DDP with the default process group
  created on backend ``"stragg"``: stragg's all_reduce carries the gradient buckets, the other
  collectives go to its inner Gloo (CPU) / NCCL (CUDA).
- ``"ddp_stragg_hook"`` (:class:`DDPStraggHookStrategy`): the default process group stays on Gloo
  (CPU) or NCCL (CUDA); only DDP's gradient all_reduce runs on a stragg group, through
  :mod:`stragg.ddp`'s communication hook. Lightning's own ``DDPStrategy(ddp_comm_hook=...)``
  registers hooks on CUDA only (on CPU it silently trains without the hook); this strategy
  registers it on CPU as well as CUDA.

:class:`StragglerReportCallback` logs per-rank lateness and the straggler verdict
(:func:`stragg.straggler_report`) to the trainer's loggers every N steps.

Both work with the ``pytorch_lightning`` package and with ``lightning`` (``lightning.pytorch``):
the classes here belong to the first one found, :func:`strategy_classes` gives either. Both
strategies register a ``comm_hook_state`` / stragg group a test can read with
``stragg.backend_stats(strategy.stragg_group)``.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

import torch.distributed as dist

from .. import ddp as stragg_ddp
from .._registration import BACKEND_NAME
from . import missing
from ._report import PeriodicReport, ReportAccess

logger = logging.getLogger("stragg")

__all__ = [
    "STRATEGY_NAMES",
    "DDPStraggHookStrategy",
    "DDPStraggStrategy",
    "StragglerReportCallback",
    "callback_class",
    "register_strategies",
    "strategy_classes",
]

STRATEGY_NAMES = ("ddp_stragg", "ddp_stragg_hook")
_NAMESPACES = ("pytorch_lightning", "lightning.pytorch")


def _make_classes(namespace: str) -> tuple[type, type]:
    """Subclasses of one Lightning namespace's DDPStrategy."""
    ddp_strategy = importlib.import_module(f"{namespace}.strategies").DDPStrategy
    overrides = importlib.import_module(f"{namespace}.overrides.distributed")

    class DDPStraggStrategy(ddp_strategy):  # type: ignore[misc, valid-type]
        """DDP whose default process group uses backend "stragg" (all_reduce on stragg).

        Accepts every DDPStrategy argument. ``process_group_backend`` defaults to ``"stragg"``;
        another value must still name stragg (e.g. ``"cpu:stragg,cuda:nccl"``). A
        ``ddp_comm_hook`` is registered on CPU as well as CUDA.
        """

        strategy_name = "ddp_stragg"

        def __init__(self, *args: Any, process_group_backend: str | None = None, **kw: Any):
            backend = process_group_backend or BACKEND_NAME
            if BACKEND_NAME not in backend:
                raise ValueError(
                    f"{type(self).__name__}: process_group_backend={backend!r} does not use "
                    f"stragg; use Lightning's DDPStrategy for other backends, or "
                    f"strategy='ddp_stragg_hook' to keep {backend!r} and add stragg's hook"
                )
            super().__init__(*args, process_group_backend=backend, **kw)

        @property
        def stragg_group(self) -> dist.ProcessGroup:
            """The stragg process group carrying the gradient all_reduce (the default group)."""
            return dist.distributed_c10d._get_default_group()

        def _register_ddp_hooks(self) -> None:
            # Lightning's DDPStrategy registers a user hook only when root_device is CUDA.
            if self._ddp_comm_hook is not None:
                overrides._register_ddp_comm_hook(
                    model=self.model,
                    ddp_comm_state=self._ddp_comm_state,
                    ddp_comm_hook=self._ddp_comm_hook,
                    ddp_comm_wrapper=self._ddp_comm_wrapper,
                )

    class DDPStraggHookStrategy(ddp_strategy):  # type: ignore[misc, valid-type]
        """DDP on Gloo/NCCL whose gradient buckets are averaged by stragg's comm hook.

        Args (besides DDPStrategy's):
            stragg_group: the stragg process group for the hook (from
                ``dist.new_group(backend="stragg")``), or ``None`` (default): a stragg group over
                all ranks, created when DDP is set up.

        ``ddp_comm_hook`` / ``ddp_comm_state`` / ``ddp_comm_wrapper`` are not accepted: this
        strategy's hook is stragg's (use ``"ddp_stragg"`` with your own hook instead).
        """

        strategy_name = "ddp_stragg_hook"

        def __init__(self, *args: Any, stragg_group: dist.ProcessGroup | None = None, **kw: Any):
            taken = [
                k for k in ("ddp_comm_hook", "ddp_comm_state", "ddp_comm_wrapper") if kw.get(k)
            ]
            if taken:
                raise ValueError(
                    f"{type(self).__name__}: {', '.join(taken)} cannot be combined with stragg's "
                    "communication hook; use strategy='ddp_stragg' (or DDPStraggStrategy) to run "
                    "your own hook on a stragg process group"
                )
            backend = kw.get("process_group_backend")
            if backend is not None and BACKEND_NAME in backend:
                raise ValueError(
                    f"{type(self).__name__}: process_group_backend={backend!r}: the hook strategy "
                    "keeps Gloo/NCCL as the default group; use strategy='ddp_stragg' for a stragg "
                    "default group"
                )
            super().__init__(*args, **kw)
            self._stragg_group = stragg_group
            self.comm_hook_state: stragg_ddp.StraggHookState | None = None

        @property
        def stragg_group(self) -> dist.ProcessGroup | None:
            """The stragg process group of the hook (None before DDP is set up)."""
            return None if self.comm_hook_state is None else self.comm_hook_state.process_group

        def _register_ddp_hooks(self) -> None:
            # Lightning's DDPStrategy registers hooks only when root_device is CUDA.
            self.comm_hook_state = stragg_ddp.register(self.model, self._stragg_group)
            logger.info(
                "stragg: Lightning %s: DDP on %s (%s), gradient all_reduce on stragg group %s",
                self.strategy_name,
                self._get_process_group_backend(),
                self.root_device.type,
                self.comm_hook_state.process_group.group_name,
            )

        def teardown(self) -> None:
            state, self.comm_hook_state = self.comm_hook_state, None
            super().teardown()
            default = dist.distributed_c10d._get_default_group() if dist.is_initialized() else None
            if state is not None and self._stragg_group is None and state.process_group != default:
                dist.destroy_process_group(state.process_group)  # the group we created

    return DDPStraggStrategy, DDPStraggHookStrategy


def _make_callback(namespace: str) -> type:
    """The straggler-report callback of one Lightning namespace."""
    callback_base = importlib.import_module(namespace).Callback

    class StragglerReportCallback(ReportAccess, callback_base):  # type: ignore[misc, valid-type]
        """Logs per-rank lateness and the straggler verdict every ``every_n_steps`` steps.

        Every ``every_n_steps`` optimizer steps it takes ``stragg.straggler_report(group)`` and
        logs :func:`stragg.straggler.report_metrics` (``stragg/straggler``,
        ``stragg/rank<r>/lateness_p50_ms``, ``.../lateness_ewma_ms``, ``.../share_last``,
        ``.../score``, ``.../verdict``: 0 none, 1 transient, 2 chronic) to the trainer's loggers,
        plus one INFO line (logger "stragg"). ``group``: the stragg group (default: the
        strategy's ``stragg_group``, else the default group). ``sync=True`` adds a stragg barrier
        per report so every rank's report is identical. ``history`` holds (step, metrics) per
        report, ``last_report`` the latest StragglerReport. A group that is not stragg, or whose
        profiler is off, raises when training starts.
        """

        def __init__(
            self,
            every_n_steps: int = 50,
            group: dist.ProcessGroup | None = None,
            sync: bool = False,
        ) -> None:
            super().__init__()
            self._periodic = PeriodicReport(
                "StragglerReportCallback", every_n_steps, group, sync
            )

        def _group(self, trainer: Any) -> dist.ProcessGroup | None:
            if self._periodic.group is not None:
                return self._periodic.group
            return getattr(trainer.strategy, "stragg_group", None)

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self._periodic.check(self._group(trainer))

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            step = int(trainer.global_step)
            metrics = self._periodic.take(step, self._group(trainer))
            if metrics is not None:
                for lg in trainer.loggers:
                    lg.log_metrics(metrics, step=step)

    return StragglerReportCallback


_CALLBACKS: dict[str, type] = {}


def callback_class(namespace: str = "") -> type:
    """StragglerReportCallback for ``"pytorch_lightning"`` or ``"lightning.pytorch"`` (default:
    the first installed)."""
    return _for_namespace(_CALLBACKS, _make_callback, namespace)


_CLASSES: dict[str, tuple[type, type]] = {}


def strategy_classes(namespace: str = "") -> tuple[type, type]:
    """(DDPStraggStrategy, DDPStraggHookStrategy) for ``"pytorch_lightning"`` or
    ``"lightning.pytorch"`` (default: the first installed)."""
    return _for_namespace(_CLASSES, _make_classes, namespace)


def _for_namespace(cache: dict[str, Any], make: Any, namespace: str) -> Any:
    """What `make` builds (a class or a tuple of classes) for `namespace`, else for the first
    Lightning namespace installed; cached. Each class gets an importable name (pickling for
    spawn-started ranks): <Class>__<namespace with _> in this module."""
    for name in (namespace,) if namespace else _NAMESPACES:
        if name in cache:
            return cache[name]
        try:
            made = make(name)
        except ImportError:
            continue
        for cls in made if isinstance(made, tuple) else (made,):
            base = cls.__name__.split("__")[0]
            unique = f"{base}__{name.replace('.', '_')}"
            cls.__name__ = cls.__qualname__ = unique
            cls.__module__ = __name__
            globals()[unique] = cls
        cache[name] = made
        return made
    raise missing("lightning", "pytorch-lightning (or lightning)")


def register_strategies(namespace: str = "") -> list[str]:
    """Registers "ddp_stragg" and "ddp_stragg_hook" in the strategy registry of every installed
    Lightning namespace (or only ``namespace``); returns the namespaces registered. Idempotent;
    done on import of this module."""
    done = []
    for name in (namespace,) if namespace else _NAMESPACES:
        try:
            registry = importlib.import_module(f"{name}.strategies").StrategyRegistry
        except ImportError:
            continue
        plain, hook = strategy_classes(name)
        for cls, desc in (
            (plain, "DDP on a stragg process group (stragg all_reduce)"),
            (hook, "DDP on Gloo/NCCL with stragg's gradient all_reduce hook (CPU and CUDA)"),
        ):
            registry.register(
                cls.strategy_name,
                cls,
                description=desc,
                override=True,
            )
        done.append(name)
    if not done and not namespace:
        raise missing("lightning", "pytorch-lightning (or lightning)")
    return done


register_strategies()
DDPStraggStrategy, DDPStraggHookStrategy = strategy_classes()
for _cls, _name in (
    (DDPStraggStrategy, "DDPStraggStrategy"),
    (DDPStraggHookStrategy, "DDPStraggHookStrategy"),
):
    _cls.__name__ = _cls.__qualname__ = _name  # the documented names, for the default namespace
del _cls, _name
StragglerReportCallback = callback_class()
StragglerReportCallback.__name__ = StragglerReportCallback.__qualname__ = "StragglerReportCallback"
