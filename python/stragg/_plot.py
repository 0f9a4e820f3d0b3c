"""Figures of stragg's straggler profile (used by ``stragg.profiler.plot``).

``plot_summary(summary, path)`` draws two panels in the style of StragglAR's Fig. 2a / Fig. 8:

(a) the CDF of the per-call straggler delay estimates (``summary["delays_s"]``, shown in ms);
(b) how often each rank was the last to arrive (``summary["last_counts"]``).

matplotlib is imported lazily (Agg backend, no display needed), so ``import stragg`` never needs
it. No output is printed; the figure is written to ``path``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["draw_summary", "plot_summary"]

_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red")


def _say(ax: Any, text: str) -> None:
    """Writes `text` in grey in the middle of an empty plot."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "stragg: plotting needs matplotlib, which is not installed: pip install matplotlib"
        ) from e
    # Only switch backend when pyplot was not imported yet (so a notebook's backend survives).
    import sys

    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _floats(values: Any) -> list[float]:
    out = []
    for v in values or ():
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if not math.isnan(f):
            out.append(f)
    return out


def _ints(values: Any) -> list[int]:
    out = []
    for v in values or ():
        try:
            out.append(int(v))
        except (TypeError, ValueError):
            out.append(0)
    return out


def _label(summary: Mapping[str, Any], default: str) -> str:
    label = summary.get("label")
    return str(label) if label else default


def plot_summary(
    summary: Mapping[str, Any],
    path: str | os.PathLike[str],
    title: str = "",
    compare: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """Saves a two-panel PNG of a ``stragg.profiler.summary()`` dict to ``path``; returns the path.

    Args:
        summary: needs ``"delays_s"`` (list of floats, seconds) and ``"last_counts"`` (list of
            ints indexed by rank); ``"straggler"`` (int or None), ``"n"`` and ``"label"`` are
            used when present. Missing or empty series give an empty panel with a note instead
            of an error.
        path: the PNG file to write (parent directories must exist).
        title: a figure title (suptitle); empty for none.
        compare: optional second summary (or a list of them) drawn in the same panels for
            comparison, e.g. another run or another group. Its ``"label"`` names it in the legend.

    Raises:
        ImportError: matplotlib is not installed (``pip install matplotlib``).
    """
    plt = _pyplot()
    fig, (ax_cdf, ax_last) = plt.subplots(1, 2, figsize=(10.0, 3.8))
    try:
        draw_summary(ax_cdf, ax_last, summary, compare=compare)
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        out = os.fspath(path)
        fig.savefig(out, dpi=110)
    finally:
        plt.close(fig)
    return out


def draw_summary(
    ax_cdf: Any,
    ax_last: Any,
    summary: Mapping[str, Any],
    compare: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    labels: tuple[str, str] = ("(a)", "(b)"),
) -> None:
    """Draws the two panels of :func:`plot_summary` on existing matplotlib axes (for figures
    that combine them with other panels). ``labels`` prefix the two panel titles."""
    if compare is None:
        others: list[Mapping[str, Any]] = []
    elif isinstance(compare, Mapping):
        others = [compare]
    else:
        others = list(compare)
    series = [summary, *others]
    names = [_label(s, "this run" if i == 0 else f"run {i + 1}") for i, s in enumerate(series)]
    many = len(series) > 1

    # (a) CDF of the straggler delay estimates, in milliseconds.
    drew = False
    for i, (s, name) in enumerate(zip(series, names)):
        delays_ms = sorted(d * 1e3 for d in _floats(s.get("delays_s")))
        if not delays_ms:
            continue
        k = len(delays_ms)
        ys = [(j + 1) / k for j in range(k)]
        ax_cdf.step(
            delays_ms,
            ys,
            where="post",
            color=_COLORS[i % len(_COLORS)],
            label=f"{name} ({k} calls)" if many else f"{k} calls",
        )
        drew = True
    if drew:
        ax_cdf.set_ylim(0.0, 1.02)
        ax_cdf.legend(loc="lower right", fontsize="small")
    else:
        _say(ax_cdf, "no delay samples")
    ax_cdf.set_xlabel("straggler delay estimate per call (ms)")
    ax_cdf.set_ylabel("CDF")
    ax_cdf.set_title(f"{labels[0]} straggler delay".strip(), fontsize="medium")
    ax_cdf.grid(True, alpha=0.3)

    # (b) who arrived last, per rank.
    counts = [_ints(s.get("last_counts")) for s in series]
    n = max([len(c) for c in counts] + [_int_or_zero(s.get("n")) for s in series] + [0])
    if n > 0:
        width = 0.8 / len(series)
        for i, (c, s, name) in enumerate(zip(counts, series, names)):
            c = c + [0] * (n - len(c))
            xs = [r - 0.4 + width * (i + 0.5) for r in range(n)]
            straggler = s.get("straggler")
            colors = [
                "tab:red"
                if (not many and straggler is not None and r == straggler)
                else _COLORS[i % len(_COLORS)]
                for r in range(n)
            ]
            ax_last.bar(xs, c, width=width, color=colors, label=name if many else None)
        ax_last.set_xticks(list(range(n)))
        if many:
            ax_last.legend(fontsize="small")
    else:
        _say(ax_last, "no arrival counts")
    ax_last.set_xlabel("rank")
    ax_last.set_ylabel("calls in which it arrived last")
    straggler = summary.get("straggler")
    suffix = f" (persistent straggler: rank {straggler})" if straggler is not None else ""
    ax_last.set_title(f"{labels[1]} last to arrive{suffix}".strip(), fontsize="medium")
    ax_last.grid(True, axis="y", alpha=0.3)


def _int_or_zero(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0
