"""The main demo's figure (examples/finetune.py) marks every decision of stragg's profiler: an
adoption as a red dashed line, a drop as a black dotted one that says why (the profiler's "for
its gain" / "for its share"). Synthetic job results, no training run (the demo itself:
test_finetune_demo.py)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


def _finetune() -> Any:
    path = REPO / "examples" / "finetune.py"
    spec = importlib.util.spec_from_file_location("finetune_demo", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


STEPS = 30
DECISIONS = [
    {"call": 10, "straggler": 3, "reason": "adopted: rank 3 was last in 100.0% of ..."},
    {
        "call": 40,
        "straggler": None,
        "reason": "rank 3 dropped for its gain: predicted gain -0.106 ms per call over Ring "
        "with StragglAR (critical delay 0.2 ms at 4096 bytes), needs > 0.000 ms (not for its "
        "share: last in 68.3% of the window's 63 significant calls, drop below 30.0%; ...)",
    },
]


def _results() -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    # Two all_reduces a step: call c is issued in step c // 2 (0-based).
    job = {
        "step_s": [0.05] * STEPS,
        "losses": [1.0 - 0.01 * i for i in range(STEPS)],
        "model": "gpt2-tiny",
        "params": 1e6,
        "injected_straggler": 3,
        "delay_s": 0.04,
    }
    stragg = dict(
        job,
        profile={"decisions": DECISIONS, "straggler": None, "delays_s": [0.04] * 8, "n": 4},
        calls_before_step=[2 * i for i in range(STEPS)],
        calls_end=2 * STEPS - 1,
    )
    det = {
        "decisions": DECISIONS,
        "detected_straggler": 3,
        "detected_at_step": 6,
        "first_stragglar_step": 7,
    }
    return {"gloo": dict(job), "stragg": stragg}, det


def test_decision_marks_an_adoption_and_a_drop_with_its_reason() -> None:
    fin = _finetune()
    results, det = _results()
    marks = fin.decision_marks(results["stragg"], det)
    assert marks == [
        # The first adoption at the first step that ran StragglAR.
        {"step": 7, "kind": "adopt", "rank": 3, "label": "stragg: StragglAR for rank 3"},
        {"step": 21, "kind": "drop", "rank": 3, "label": "stragg: rank 3 dropped (for its gain)"},
    ]
    # Without a profiler (a configured straggler): the step StragglAR first ran, as before.
    no_prof = fin.decision_marks(None, {"first_stragglar_step": 4, "detected_straggler": 1})
    assert [(m["step"], m["kind"], m["rank"]) for m in no_prof] == [(4, "adopt", 1)]


def test_figure_draws_the_drop_beside_the_adoption(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fin = _finetune()
    results, det = _results()
    figures: list[Any] = []
    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig))
    args = argparse.Namespace(ranks=4, warmup=2)
    out = tmp_path / "demo.png"
    try:
        assert fin.plot_results(str(out), args, results, det) == str(out)
        assert out.stat().st_size > 10_000
        assert len(figures) == 1
        ax_t = figures[0].axes[0]
        lines = {line.get_label(): line for line in ax_t.get_lines()}
        adopt = lines["stragg: StragglAR for rank 3"]
        drop = lines["stragg: rank 3 dropped (for its gain)"]
        assert adopt.get_xdata()[0] == 7 and adopt.get_linestyle() == "--"
        assert drop.get_xdata()[0] == 21 and drop.get_linestyle() == ":"
        _, labels = ax_t.get_legend_handles_labels()
        assert "stragg: rank 3 dropped (for its gain)" in labels
    finally:
        for fig in figures:
            real_close(fig)
