"""The README's main demo, examples/finetune.py, in a short run: DDP on gloo, then on stragg,
with an injected straggler; checks the JSON summary, that both loss curves agree, and that
stragg's profiler detected the injected straggler and StragglAR then ran with it.

Detection with the default profiler settings needs dozens of calls (an exchange every 16 calls,
two agreeing decisions); this short run asks for an exchange every 2 calls over a window of 8 and
one decision (STRAGG_PROFILE_*, documented settings), and the straggler sleeps 40 ms per step so
that it is last in every step however loaded the 2 shared cores are.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "examples" / "finetune.py"

pytestmark = [pytest.mark.slow, pytest.mark.needs_backend, pytest.mark.stragg_only]

STEPS = 16
TINY_MODEL = [
    "--layers", "1", "--d-model", "64", "--heads", "2", "--vocab", "128",
    "--seq", "16", "--batch", "2",
]  # fmt: skip


def _run(tmp_path: Path, *extra: str) -> tuple[dict, subprocess.CompletedProcess]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRAGG_")}
    env.update(STRAGG_PROFILE_EVERY="2", STRAGG_PROFILE_WINDOW="8", STRAGG_PROFILE_PATIENCE="1")
    cmd = [
        sys.executable, str(SCRIPT), "--steps", str(STEPS), "--warmup", "2", "--ranks", "4",
        "--json", *TINY_MODEL, *extra,
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, f"finetune.py failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no stdout; stderr:\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1]), proc


def test_finetune_demo_json_and_matching_losses(tmp_path: Path) -> None:
    plot = tmp_path / "demo.png"
    out, proc = _run(
        tmp_path, "--straggler-rank", "3", "--straggler-delay-ms", "40",
        "--straggler-mode", "sleep", "--plot", str(plot),
    )  # fmt: skip

    # Stable keys and types.
    assert out["injected_straggler"] == 3
    # stragg's profiler found the injected straggler, and later steps ran StragglAR around it.
    assert out["detected_straggler"] == 3, out.get("decisions")
    assert isinstance(out["detected_at_step"], int) and 1 <= out["detected_at_step"] <= STEPS
    assert isinstance(out["first_stragglar_step"], int)
    assert out["first_stragglar_step"] >= out["detected_at_step"]
    for key in ("gloo_step_s", "stragg_step_s", "speedup", "loss_rel_diff", "delay_s"):
        assert isinstance(out[key], float), (key, out[key])
    assert out["gloo_step_s"] > 0 and out["stragg_step_s"] > 0
    assert out["speedup"] == pytest.approx(out["gloo_step_s"] / out["stragg_step_s"])
    assert out["delay_s"] == pytest.approx(0.040)
    assert out["steps"] == STEPS
    assert out["backends"] == ["gloo", "stragg"]

    # Both runs completed every step, and the loss curves agree (summation order only).
    for backend in ("gloo", "stragg"):
        assert len(out[f"{backend}_losses"]) == STEPS
        assert len(out[f"{backend}_step_times_s"]) == STEPS
        assert all(isinstance(x, float) and math.isfinite(x) for x in out[f"{backend}_losses"])
    assert out["loss_rel_diff"] < 1e-4, out["loss_rel_diff"]
    # The synthetic language is learnable: the loss falls even in a few steps.
    assert out["gloo_losses"][-1] < out["gloo_losses"][0]

    # The stragg job ran DDP's gradient all_reduces on stragg's executor.
    stats = out["stragg_backend_stats"]
    assert stats["allreduce_calls"] >= STEPS
    assert stats["failed_calls"] == 0

    if importlib.util.find_spec("matplotlib") is not None:
        assert out["plot"] == str(plot)
        assert plot.stat().st_size > 10_000
    assert "speedup" in proc.stderr  # the human-readable report went to stderr
