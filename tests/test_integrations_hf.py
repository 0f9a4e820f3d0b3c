"""stragg.integrations.hf: examples/hf_trainer.py under torchrun with 2 CPU ranks, Trainer and a
plain Accelerator loop, on stragg (use_stragg()) and on Gloo: stragg carries the gradient
all_reduces and the losses equal Gloo's. Plus the names accelerate / TrainingArguments / the
Trainer's command line accept after use_stragg(), its errors, and the not-wrapped warning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import _harness as h
import pytest

# CI (STRAGG_TEST_REQUIRE=1) installs both: there a missing library fails, elsewhere it skips.
if os.environ.get("STRAGG_TEST_REQUIRE") != "1":
    pytest.importorskip("accelerate", reason="accelerate is not installed")
    pytest.importorskip("transformers", reason="transformers is not installed")

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "hf_trainer.py"
STEPS = 6

pytestmark = [pytest.mark.needs_backend, pytest.mark.stragg_only]


def _torchrun(
    tmp_path: Path, script: Path, args: list[str], **extra_env: str
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STRAGG_", "MASTER_"))}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **extra_env)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    return subprocess.run(
        [*cmd, str(script), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _example(tmp_path: Path, *args: str, **extra_env: str) -> tuple[dict[str, Any], str]:
    proc = _torchrun(tmp_path, EXAMPLE, [*args, "--steps", str(STEPS), "--json"], **extra_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("api", ["trainer", "accelerate"])
def test_example_on_stragg_matches_gloo(tmp_path: Path, api: str) -> None:
    gloo, _ = _example(tmp_path, "--api", api, "--backend", "gloo")
    out, _ = _example(tmp_path, "--api", api, "--backend", "stragg")
    assert gloo["backend"] == "gloo" and gloo["stragg_stats"] is None
    assert out["backend"] == "stragg"
    assert out["wrapped_in_ddp"] is True and gloo["wrapped_in_ddp"] is True
    stats = out["stragg_stats"]
    assert stats["allreduce_calls"] >= STEPS, stats  # one gradient bucket per step, at least
    assert stats["failed_calls"] == 0
    assert stats["transport"] == "shm"
    assert len(out["losses"]) == STEPS
    # Two ranks: the gradient average is the same float on both backends.
    assert out["losses"] == gloo["losses"]
    assert out["losses"][-1] < out["losses"][0]
    # The Trainer's StragglerReportCallback (every 2 steps) logged through trainer.log.
    if api == "trainer":
        assert [step for step, _ in out["reported_metrics"]] == list(range(2, STEPS + 1, 2))
        assert out["straggler_report"]["n"] == 2
        assert "stragg/straggler" in out["reported_metrics"][0][1]
    else:
        assert out["straggler_report"] is None


@pytest.mark.slow
def test_warns_when_the_model_is_not_wrapped(tmp_path: Path) -> None:
    # use_cpu=False where no GPU is visible (none on this host, or hidden from the ranks):
    # accelerate sets up no distributed training at all.
    out, stderr = _example(
        tmp_path, "--api", "accelerate", "--use-cpu", "0", CUDA_VISIBLE_DEVICES=""
    )
    assert out["wrapped_in_ddp"] is False
    assert (
        "ModelNotWrappedWarning: stragg: rank 0: WORLD_SIZE=2, but accelerate did not wrap "
        in stderr
    )
    assert "gradients are NOT synchronised" in stderr
    assert "pass cpu=True to Accelerator (use_cpu=True to TrainingArguments)" in stderr


_NAMES = """
import json, os, sys, tempfile
import torch.distributed as dist
from accelerate import Accelerator, PartialState
from accelerate.state import AcceleratorState
from accelerate.utils import InitProcessGroupKwargs
from transformers import HfArgumentParser, TrainingArguments
import stragg.integrations.hf as shf

out = {}
# A fresh TCPStore for every process group below: stragg cannot yet re-create the default group
# on the store of a destroyed one (same group name, stale keys); see docs/integrations.md.
os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"
ports = iter(os.environ["TEST_PORTS"].split(","))
os.environ["MASTER_PORT"] = next(ports)
def reset():
    if dist.is_initialized():
        dist.destroy_process_group()
    AcceleratorState._reset_state(reset_partial_state=True)
    os.environ["MASTER_PORT"] = next(ports)

try:  # accelerate alone rejects the name on CPU
    PartialState(cpu=True, backend="stragg")
except ValueError as e:
    out["without"] = str(e)
reset()
PartialState(cpu=True)  # a Gloo state set up first: use_stragg() must refuse
try:
    shf.use_stragg()
except RuntimeError as e:
    out["late"] = str(e)
reset()

shf.use_stragg()
# The Trainer's command line: --ddp_backend stragg is a valid choice now.
parser = HfArgumentParser(TrainingArguments)
(targs,) = parser.parse_args_into_dataclasses(
    ["--output_dir", tempfile.mkdtemp(), "--ddp_backend", "stragg", "--use_cpu",
     "--report_to", "none"])
targs.device  # sets up accelerate's state and the process group
out["cli"] = [dist.get_backend(), PartialState().backend, PartialState().distributed_type.value]
reset()
acc = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(backend="cpu:stragg")])
out["kwargs"] = [dist.get_backend(), acc.state.backend]
reset()
acc = Accelerator(cpu=True)  # no name given: stragg is the default now
out["default"] = [dist.get_backend(), acc.state.backend]
reset()
shf.restore()
acc = Accelerator(cpu=True)
out["restored"] = [dist.get_backend(), acc.state.backend]
reset()
if os.environ["RANK"] == "0":
    print(json.dumps(out))
"""


@pytest.mark.slow
def test_backend_names_accepted_after_use_stragg(tmp_path: Path) -> None:
    script = tmp_path / "names.py"
    script.write_text(textwrap.dedent(_NAMES))
    with h.reserved_ports(10) as ports:  # rank 0's env:// TCPStores listen on them in turn
        proc = _torchrun(tmp_path, script, [], TEST_PORTS=",".join(map(str, ports)))
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["without"] == "Your assigned backend stragg is not available, please use gloo"
    assert out["late"].startswith(
        "stragg.integrations.hf.use_stragg: accelerate's state is already set up on backend 'gloo'"
    )
    assert out["cli"] == ["stragg", "stragg", "MULTI_CPU"]
    assert out["kwargs"] == ["cpu:stragg", "cpu:stragg"]
    assert out["default"] == ["stragg", "stragg"]
    assert out["restored"] == ["gloo", "gloo"]


def test_use_stragg_rejects_other_backends() -> None:
    import stragg.integrations.hf as shf

    with pytest.raises(ValueError, match=r"backend='gloo' does not name stragg"):
        shf.use_stragg("gloo")
    assert not shf.is_active()
