#!/usr/bin/env python3
"""Fails on any #include from a lower C++ layer to a higher one.

Every directory of csrc/ is one layer, and kernels/ (the GPU parts) is one more. Layers have
levels, lowest first; a file may include headers of its own layer and of lower levels only.
Layers on the same level (plan and kernels; backend and bindings) are siblings and include
neither each other. A directory of csrc/ missing from LAYERS fails too, so a new layer must be
placed before it is used.

    python scripts/check_layers.py [--root DIR]

Prints one line "check_layers: OK ..." and exits 0, or names every offending include
(file:line, the include, the two layers and their levels) and exits 1. Run by CTest as
check_layers in the torch-free build (tests/cpp/CMakeLists.txt).
"""

from __future__ import annotations

import argparse
import posixpath
import re
import sys
from pathlib import Path

# (layer, level): lowest level first. A layer's directory is csrc/<layer>, except kernels/.
LAYERS: list[tuple[str, int]] = [
    ("common", 0),  # errors, logging, host identity, rendezvous
    ("core", 1),  # schedule IR, generators, verifier, simulator
    ("transport", 2),  # Transport interface; shm/, tcp/, mixed/
    ("runtime", 3),  # executor over a Transport, reductions, LoweredSchedule
    ("plan", 4),  # settings table, planner, lowering, profiler
    ("kernels", 4),  # GPU executor, kernels, GPU point-to-point (above runtime, beside plan)
    ("session", 5),  # the torch-free coordinator of a group
    ("backend", 6),  # stragg._C, the torch adapter
    ("bindings", 6),  # stragg._core, the torch-free Python module
]
LEVEL = dict(LAYERS)

SOURCE_SUFFIXES = {".h", ".hh", ".hpp", ".inc", ".cc", ".cpp", ".cu", ".cuh"}
INCLUDE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<([^>]+)>)')


def layer_dirs(root: Path) -> dict[str, Path]:
    return {
        name: root / ("kernels" if name == "kernels" else f"csrc/{name}") for name, _ in LAYERS
    }


def layer_of_path(rel: str) -> str | None:
    """The layer of a repository-relative path (posix), or None outside csrc/ and kernels/."""
    parts = rel.split("/")
    if parts[0] == "kernels":
        return "kernels"
    if parts[0] == "csrc" and len(parts) > 2:
        return parts[1]
    return None


def included_layer(rel_file: str, target: str, quoted: bool) -> str | None:
    """The layer an include names, or None for a system header or a file of no layer."""
    if quoted and (target.startswith("./") or target.startswith("../")):
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(rel_file), target))
        return layer_of_path(resolved)
    first = target.split("/")[0]
    if "/" in target and first in LEVEL:
        return first
    return None  # "same_dir.h", <vector>, <nlohmann/json.hpp>, ...


def check(root: Path) -> tuple[list[str], int, int]:
    """Returns (problems, files scanned, cross-layer includes checked)."""
    problems: list[str] = []
    dirs = layer_dirs(root)
    csrc = root / "csrc"
    if csrc.is_dir():
        for d in sorted(p for p in csrc.iterdir() if p.is_dir()):
            if d.name not in LEVEL:
                problems.append(
                    f"csrc/{d.name}/: a directory that is no layer: add it to LAYERS in "
                    "scripts/check_layers.py (and docs/architecture.md) at its level"
                )
    files = 0
    checked = 0
    for name, level in LAYERS:
        base = dirs[name]
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            if path.suffix not in SOURCE_SUFFIXES or not path.is_file():
                continue
            files += 1
            rel = path.relative_to(root).as_posix()
            text = path.read_text(encoding="utf-8", errors="replace")
            for lineno, line in enumerate(text.splitlines(), start=1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                quoted = m.group(1) is not None
                target = m.group(1) if quoted else m.group(2)
                other = included_layer(rel, target, quoted)
                if other is None or other == name:
                    continue
                checked += 1
                if other not in LEVEL:
                    problems.append(
                        f'{rel}:{lineno}: #include "{target}": {name} includes {other}, '
                        "which is no layer"
                    )
                elif LEVEL[other] > level:
                    problems.append(
                        f'{rel}:{lineno}: #include "{target}": {name} (level {level}) includes '
                        f"{other} (level {LEVEL[other]}), a higher layer"
                    )
                elif LEVEL[other] == level:
                    problems.append(
                        f'{rel}:{lineno}: #include "{target}": {name} (level {level}) includes '
                        f"{other} (level {LEVEL[other]}), a sibling layer"
                    )
    return problems, files, checked


def order_text() -> str:
    levels: dict[int, list[str]] = {}
    for name, level in LAYERS:
        levels.setdefault(level, []).append(name)
    return " < ".join(", ".join(names) for _, names in sorted(levels.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parent.parent,
        help="repository root holding csrc/ and kernels/ (default: this script's repository)",
    )
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if not (root / "csrc").is_dir():
        print(f"check_layers: {root} has no csrc/ directory", file=sys.stderr)
        return 2
    problems, files, checked = check(root)
    if problems:
        for p in problems:
            print(p)
        print(
            f"check_layers: FAILED: {len(problems)} problem(s); layers may include only their "
            f"own and lower levels: {order_text()}"
        )
        return 1
    print(
        f"check_layers: OK: {checked} includes across layers in {files} files point down "
        f"({order_text()})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
