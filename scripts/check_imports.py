#!/usr/bin/env python3
"""Fails on any import circle among the modules of the Python package (python/stragg).

Every import of a module of the package counts, at module level or inside a function or an
`if`: `import stragg.x`, `from stragg.x import y`, `from stragg import x`, `from . import x`,
`from .x import y`. `from P import name` points to the module P.name when there is one, else to
P itself (its __init__.py); the C++ extension modules (EXTENSIONS) have no Python imports and are
left out. Importing a module does not count as importing the packages above it, so a package's
__init__.py may import its own modules.

    python scripts/check_imports.py [--root DIR]

Prints one line "check_imports: OK ..." and exits 0, or names every circle it finds (each import
on it as file:line) and exits 1. Run by CTest as check_imports in the torch-free build
(tests/cpp/CMakeLists.txt), beside the C++ layer check (check_layers.py).
"""

from __future__ import annotations

import argparse
import ast
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

PACKAGE = "stragg"
PACKAGE_DIR = "python/stragg"  # relative to the repository root
EXTENSIONS = {"stragg._C", "stragg._core"}  # built from csrc/backend and csrc/bindings


def module_files(package_dir: Path) -> dict[str, Path]:
    """Module name -> file, for every .py file under the package directory."""
    modules: dict[str, Path] = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = [PACKAGE, *path.relative_to(package_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def targets(
    node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: dict[str, Path]
) -> list[str]:
    """The absolute names of what one import statement imports: `import a.b` imports a.b;
    `from P import x` imports the module P.x if there is one (nothing for an extension module),
    else P (x is a name P defines)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: level 1 is the importer's package, 2 the one above, ...
        package = module if is_package else module.rpartition(".")[0]
        parts = package.split(".")
        anchor = ".".join(parts[: len(parts) - (node.level - 1)])
        base = f"{anchor}.{base}" if base else anchor
    found = []
    for alias in node.names:
        name = f"{base}.{alias.name}"
        if name in modules:
            found.append(name)
        elif name not in EXTENSIONS:
            found.append(base)
    return found


def imports(modules: dict[str, Path]) -> dict[tuple[str, str], tuple[Path, int]]:
    """(importer, imported) -> the first place (file, line) the importer imports it."""
    edges: dict[tuple[str, str], tuple[Path, int]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):  # every statement, also inside functions and ifs
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in targets(node, module, path.name == "__init__.py", modules):
                if target in modules and target != module:
                    edges.setdefault((module, target), (path, node.lineno))
    return edges


Edges = dict[tuple[str, str], tuple[Path, int]]  # (importer, imported) -> (file, line)


def circles(modules: dict[str, Path], edges: Edges) -> list[list[str]]:
    """Import circles, each as [a, b, ..., a] (a imports b ...): graphlib names one at a time;
    its last import is dropped before looking again, so each circle found is a new one."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for importer, imported in edges:
        graph[importer].add(imported)  # the imported module comes first
    found = []
    while True:
        try:
            tuple(TopologicalSorter(graph).static_order())
            return found
        except CycleError as e:
            # Each node of e.args[1] comes before (is imported by) the next one.
            circle = list(reversed(e.args[1]))
            found.append(circle)
            graph[circle[-2]].discard(circle[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parent.parent,
        help=f"repository root holding {PACKAGE_DIR}/ (default: this script's repository)",
    )
    args = parser.parse_args(argv)
    root = args.root.resolve()
    package_dir = root / PACKAGE_DIR
    if not (package_dir / "__init__.py").is_file():
        print(f"check_imports: {root} has no {PACKAGE_DIR}/__init__.py", file=sys.stderr)
        return 2
    modules = module_files(package_dir)
    edges = imports(modules)
    found = circles(modules, edges)
    if found:
        for circle in found:
            print("import circle: " + " -> ".join(circle))
            for importer, imported in zip(circle, circle[1:]):
                path, line = edges[(importer, imported)]
                rel = path.relative_to(root).as_posix()
                print(f"  {rel}:{line}: {importer} imports {imported}")
        print(
            f"check_imports: FAILED: {len(found)} import circle(s) among the modules of "
            f"{PACKAGE_DIR}; imports must point one way"
        )
        return 1
    print(
        f"check_imports: OK: {len(edges)} imports among {len(modules)} modules of {PACKAGE_DIR}, "
        "no circle"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
