"""Lightning on stragg: the same LightningModule trained with DDP on Gloo and on stragg.

    python examples/lightning_ddp.py                              # 2 CPU ranks, "ddp_stragg"
    python examples/lightning_ddp.py --strategy ddp_stragg_hook   # Gloo + stragg's DDP hook
    python examples/lightning_ddp.py --strategy ddp               # Lightning's DDP on Gloo
    python examples/lightning_ddp.py --devices 4 --steps 50 --json
    python examples/lightning_ddp.py --report-every 5 --late-rank 1   # the straggler report

What a Lightning user adds for stragg is two lines:

    import stragg.integrations.lightning                      # registers the strategy names
    trainer = L.Trainer(strategy="ddp_stragg", accelerator="cpu", devices=2)

Lightning starts the other ranks itself (it re-runs this script). The model is a small MLP
built from a config dict, trained on synthetic regression data (nothing is downloaded); each
rank reads its own shard (Lightning's DistributedSampler). Rank 0 prints its per-step losses
and, on stragg, how many all_reduces stragg carried (stragg.backend_stats); `--json` prints
them as one JSON object on the last line. On stragg, stragg.integrations.lightning's
StragglerReportCallback takes a straggler report every `--report-every` steps (5; 0: off) and
logs per-rank lateness and the verdict to the trainer's loggers; rank 0 prints what it logged
and the last report's table. `--late-rank R` makes rank R sleep 20 ms before each step's
backward (an injected straggler: the report names it; StragglAR itself needs 3 ranks or more).
The losses are the same on every strategy: the gradient average differs only in the summation
order.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning.pytorch as L  # the "lightning" package
except ImportError:
    import pytorch_lightning as L  # the "pytorch-lightning" package

import stragg
import stragg.integrations.lightning  # registers "ddp_stragg", "ddp_stragg_hook"
from stragg.integrations.lightning import StragglerReportCallback

CONFIG = {"inputs": 16, "hidden": 64, "outputs": 4, "layers": 2}


def build_model(config: dict[str, int]) -> nn.Module:
    layers: list[nn.Module] = []
    width = config["inputs"]
    for _ in range(config["layers"]):
        layers += [nn.Linear(width, config["hidden"]), nn.Tanh()]
        width = config["hidden"]
    layers.append(nn.Linear(width, config["outputs"]))
    return nn.Sequential(*layers)


def make_dataset(config: dict[str, int], samples: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, config["inputs"], generator=g)
    w = torch.randn(config["inputs"], config["outputs"], generator=g)
    noise = 0.05 * torch.randn(samples, config["outputs"], generator=g)
    y = torch.tanh(x @ w / config["inputs"] ** 0.5) + noise
    return TensorDataset(x, y)


class Regression(L.LightningModule):
    def __init__(self, config: dict[str, int], lr: float, late_rank: int = -1) -> None:
        super().__init__()
        self.net = build_model(config)
        self.lr = lr
        self.late_rank = late_rank

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        if self.global_rank == self.late_rank:
            time.sleep(0.02)  # arrives late at the gradient all_reduce
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class Record(L.Callback):
    """Per-step losses of this rank, and stragg's counters before the strategy tears down."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.stats: dict[str, Any] | None = None

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, i: int):
        self.losses.append(float(outputs["loss"]))

    def on_train_end(self, trainer: Any, module: Any) -> None:
        group = getattr(trainer.strategy, "stragg_group", None)
        if group is not None:
            stats = stragg.backend_stats(group)
            self.stats = {k: v for k, v in stats.items() if isinstance(v, (int, float, str))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--strategy", default="ddp_stragg", help="ddp_stragg, ddp_stragg_hook, ddp")
    p.add_argument("--devices", type=int, default=2, help="CPU processes (default 2)")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    p.add_argument("--batch", type=int, default=16, help="samples per rank per step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report-every", type=int, default=5, help="straggler report period (0: off)")
    p.add_argument("--late-rank", type=int, default=-1, help="this rank sleeps 20 ms per step")
    p.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    args = p.parse_args(argv)

    L.seed_everything(args.seed, verbose=False)
    model = Regression(CONFIG, args.lr, args.late_rank)
    data = make_dataset(CONFIG, args.steps * args.batch * args.devices, args.seed + 1)
    loader = DataLoader(data, batch_size=args.batch, shuffle=False)
    record = Record()
    callbacks: list[Any] = [record]
    report = None
    if "stragg" in args.strategy and args.report_every > 0:
        report = StragglerReportCallback(every_n_steps=args.report_every)
        callbacks.append(report)
    trainer = L.Trainer(
        strategy=args.strategy,
        accelerator="cpu",
        devices=args.devices,
        max_steps=args.steps,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    trainer.fit(model, loader)
    if torch.distributed.is_initialized():  # Lightning leaves the groups up; Gloo may abort at exit
        torch.distributed.destroy_process_group()
    if trainer.global_rank != 0:
        return 0
    result = {
        "strategy": args.strategy,
        "strategy_class": type(trainer.strategy).__name__,
        "backend": trainer.strategy._get_process_group_backend(),
        "world_size": trainer.world_size,
        "losses": record.losses,
        "stragg_stats": record.stats,
        "straggler_report": report.last_report.to_dict() if report and report.last_report else None,
        "reported_metrics": None if report is None else report.history,
    }
    print(
        f"{args.strategy} ({result['strategy_class']}, default group on {result['backend']}), "
        f"{trainer.world_size} ranks: loss {record.losses[0]:.5f} -> {record.losses[-1]:.5f}"
    )
    if record.stats is not None:
        print(
            f"stragg carried {record.stats['allreduce_calls']} all_reduces "
            f"({record.stats['transport']} transport)"
        )
    if report is not None:
        for step, metrics in report.history:  # what the callback logged
            shown = ", ".join(f"{k} {v:.3g}" for k, v in metrics.items())
            print(f"step {step}: {shown}")
        if report.last_report is not None:
            print(report.last_report.table())
    if args.json:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
