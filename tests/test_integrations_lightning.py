"""stragg.integrations.lightning: examples/lightning_ddp.py on 2 CPU ranks with Lightning's own
launcher, on "ddp" (Gloo), "ddp_stragg" and "ddp_stragg_hook": stragg carries the gradient
all_reduces and rank 0's losses equal the Gloo run's. Plus the strategies' error paths and the
CPU registration of a user's own DDP hook (Lightning registers hooks on CUDA only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

# CI (STRAGG_TEST_REQUIRE=1) installs it: there a missing library fails, elsewhere it skips.
if os.environ.get("STRAGG_TEST_REQUIRE") != "1":
    pytest.importorskip("pytorch_lightning", reason="pytorch-lightning is not installed")

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "lightning_ddp.py"
STEPS = 8

pytestmark = [pytest.mark.needs_backend, pytest.mark.stragg_only]


def _run(tmp_path: Path, args: list[str], script: Path = EXAMPLE) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STRAGG_", "MASTER_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def _example(tmp_path: Path, strategy: str) -> dict[str, Any]:
    proc = _run(tmp_path, ["--strategy", strategy, "--steps", str(STEPS), "--json"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = _example(tmp_path_factory.mktemp("gloo"), "ddp")
    assert out["backend"] == "gloo" and out["stragg_stats"] is None
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "cls", "backend"),
    [
        ("ddp_stragg", "DDPStraggStrategy", "stragg"),
        ("ddp_stragg_hook", "DDPStraggHookStrategy", "gloo"),
    ],
)
def test_example_runs_on_stragg_with_gloo_losses(
    tmp_path: Path, gloo_run: dict[str, Any], strategy: str, cls: str, backend: str
) -> None:
    out = _example(tmp_path, strategy)
    assert out["strategy_class"] == cls
    assert out["backend"] == backend
    assert out["world_size"] == 2
    stats = out["stragg_stats"]
    # One DDP bucket per step (the model is small): every gradient all_reduce ran on stragg.
    assert stats["allreduce_calls"] >= STEPS, stats
    assert stats["failed_calls"] == 0
    assert stats["transport"] == "shm"
    assert len(out["losses"]) == STEPS
    # Two ranks: a + b in either order is the same float; the averages, hence losses, are equal.
    assert out["losses"] == gloo_run["losses"]
    assert out["losses"][-1] < out["losses"][0]
    # StragglerReportCallback (every 5 steps) logged a report of the stragg group.
    assert [step for step, _ in out["reported_metrics"]] == [5], out["reported_metrics"]
    assert out["straggler_report"]["n"] == 2 and out["straggler_report"]["calls"] >= 4


def test_strategies_registered_by_import() -> None:
    import stragg.integrations.lightning as sl
    from pytorch_lightning.strategies import StrategyRegistry

    names = StrategyRegistry.available_strategies()
    assert "ddp_stragg" in names and "ddp_stragg_hook" in names
    assert StrategyRegistry["ddp_stragg"]["strategy"] is sl.DDPStraggStrategy
    assert StrategyRegistry["ddp_stragg_hook"]["strategy"] is sl.DDPStraggHookStrategy
    assert sl.register_strategies() == ["pytorch_lightning"]  # idempotent
    assert sl.DDPStraggStrategy().process_group_backend == "stragg"
    custom = sl.DDPStraggStrategy(process_group_backend="cpu:stragg,cuda:nccl")
    assert custom.process_group_backend == "cpu:stragg,cuda:nccl"


def test_error_messages() -> None:
    import stragg.integrations.lightning as sl

    with pytest.raises(ValueError, match=r"process_group_backend='gloo' does not use stragg"):
        sl.DDPStraggStrategy(process_group_backend="gloo")
    with pytest.raises(ValueError, match=r"ddp_comm_hook cannot be combined with stragg's"):
        sl.DDPStraggHookStrategy(ddp_comm_hook=lambda state, bucket: None)
    with pytest.raises(ValueError, match=r"keeps Gloo/NCCL as the default group"):
        sl.DDPStraggHookStrategy(process_group_backend="stragg")


def test_missing_library_message() -> None:
    from stragg.integrations import missing

    err = missing("lightning", "pytorch-lightning (or lightning)")
    assert "stragg.integrations.lightning needs pytorch-lightning (or lightning)" in str(err)


_USER_HOOK = """
import json, sys
import torch
import pytorch_lightning as pl
import stragg
import stragg.integrations.lightning
calls = []
def hook(state, bucket):
    calls.append(bucket.buffer().numel())
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut
class M(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
    def training_step(self, batch, i):
        return self.lin(batch[0]).pow(2).mean()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(12, 4))
strategy = stragg.integrations.lightning.DDPStraggStrategy(ddp_comm_hook=hook)
trainer = pl.Trainer(strategy=strategy, accelerator="cpu", devices=1, max_steps=3, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False)
trainer.fit(M(), torch.utils.data.DataLoader(data, batch_size=4))
print(json.dumps({"calls": calls, "backend": strategy.process_group_backend}))
"""


@pytest.mark.slow
def test_user_hook_registered_on_cpu(tmp_path: Path) -> None:
    script = tmp_path / "user_hook.py"
    script.write_text(textwrap.dedent(_USER_HOOK))
    proc = _run(tmp_path, [], script)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"calls": [5, 5, 5], "backend": "stragg"}
