"""What the Lightning and HF straggler-report callbacks share: a report every N steps, its flat
metrics for the trainer's logger, one INFO line (logger "stragg") per report."""

from __future__ import annotations

import logging
from typing import Any

import torch.distributed as dist

from ..straggler import StragglerReport, report_metrics, straggler_report

logger = logging.getLogger("stragg")


def verdict_line(rep: StragglerReport) -> str:
    """One line: the straggler, then every rank's verdict, share last and p50 lateness."""
    who = "none" if rep.straggler is None else f"rank {rep.straggler}"
    ranks = "; ".join(
        f"rank {r.rank} {r.verdict} (last {r.share_last * 100:.0f}%, p50 "
        f"{r.lateness_p50_s * 1e3:.2f} ms)"
        for r in rep.ranks
    )
    return f"chronic straggler {who} over {rep.calls} calls: {ranks}"


class PeriodicReport:
    """Takes a straggler report every `every_n_steps` optimizer steps."""

    def __init__(self, owner: str, every_n_steps: int, group: Any, sync: bool) -> None:
        bad = isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int)
        if bad or every_n_steps < 1:
            raise ValueError(f"{owner}: every_n_steps must be an int >= 1, got {every_n_steps!r}")
        self.owner = owner
        self.every_n_steps = every_n_steps
        self.group = group
        self.sync = sync
        self.history: list[tuple[int, dict[str, float]]] = []  # (step, metrics) per report
        self.last_report: StragglerReport | None = None
        self._last_step = -1

    def check(self, group: dist.ProcessGroup | None) -> None:
        """Raises now (naming the op, the rank, the mismatch) when no report can be made."""
        straggler_report(group)

    def take(self, step: int, group: dist.ProcessGroup | None) -> dict[str, float] | None:
        """The metrics of a report when `step` is due (once per step), else None."""
        if step <= 0 or step % self.every_n_steps or step == self._last_step:
            return None
        self._last_step = step
        rep = straggler_report(group, sync=self.sync)
        metrics = report_metrics(rep)
        self.last_report = rep
        self.history.append((step, metrics))
        logger.info("stragg: %s: step %d: %s", self.owner, step, verdict_line(rep))
        return metrics


class ReportAccess:
    """`history` and `last_report` of a callback that holds a PeriodicReport as `_periodic`."""

    _periodic: PeriodicReport

    @property
    def history(self) -> list[tuple[int, dict[str, float]]]:
        return self._periodic.history

    @property
    def last_report(self) -> StragglerReport | None:
        return self._periodic.last_report
