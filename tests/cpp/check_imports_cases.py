"""The import-circle check (scripts/check_imports.py) fails where it should: run on small fake
packages (--root) with circles through each form of import (module level and inside a function,
relative and absolute), passes on a package without one and on this repository's. Run by CTest
as check_imports_cases: python tests/cpp/check_imports_cases.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

CHECKER = Path(__file__).resolve().parents[2] / "scripts" / "check_imports.py"
PKG = "python/stragg/"


def run_checker(files: dict[str, str] | None) -> tuple[int, str]:
    """Runs the check on a fake repository of `files`, or on this repository for None."""
    with tempfile.TemporaryDirectory(prefix="stragg-imports-") as tmp:
        root = Path(tmp)
        for rel, text in (files or {}).items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        args = [] if files is None else ["--root", str(root)]
        proc = subprocess.run(
            [sys.executable, str(CHECKER), *args], check=False, capture_output=True, text=True,
            timeout=60,
        )
        return proc.returncode, proc.stdout + proc.stderr


# A package whose imports point one way: a subpackage's __init__ imports its own modules, which
# import each other relatively; names of an __init__ are imported from outside its package; the
# extension module _C is left out.
CLEAN = {
    PKG + "__init__.py": "from ._reg import f\nfrom .top import main\nfrom .sub import NAME\n",
    PKG + "_base.py": "import os\n\nfrom . import _C\n",
    PKG + "_reg.py": "from ._base import x\n\n\ndef register():\n    from .sub import y\n",
    PKG + "top.py": "import stragg._reg\nfrom stragg import _base\n",
    PKG + "sub/__init__.py": "from . import leaf\nfrom .mid import y\n\nNAME = 1\n",
    PKG + "sub/mid.py": "from . import leaf\nfrom .. import _base\n",
    PKG + "sub/leaf.py": "from .._base import x\n",
}


class CheckImportsTest(unittest.TestCase):
    def test_a_package_without_circles_passes(self) -> None:
        rc, out = run_checker(CLEAN)
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"^check_imports: OK: 12 imports among 7 modules of python/stragg")

    def test_this_repository_passes(self) -> None:
        rc, out = run_checker(None)
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"^check_imports: OK: ")

    def test_module_level_relative_circle_fails_naming_each_import(self) -> None:
        files = dict(CLEAN)
        files[PKG + "_base.py"] = "import os\n\nfrom ._reg import register\n"
        rc, out = run_checker(files)
        self.assertEqual(rc, 1, out)
        circle = r"import circle: stragg\._(base|reg) -> stragg\._\w+ -> stragg\._\1\n"
        self.assertRegex(out, circle)
        self.assertIn("python/stragg/_base.py:3: stragg._base imports stragg._reg", out)
        self.assertIn("python/stragg/_reg.py:1: stragg._reg imports stragg._base", out)
        self.assertIn("check_imports: FAILED: 1 import circle(s)", out)

    def test_function_level_absolute_import_closes_a_circle(self) -> None:
        files = dict(CLEAN)
        files[PKG + "_base.py"] = "def later():\n    import stragg.top\n"
        rc, out = run_checker(files)
        self.assertEqual(rc, 1, out)
        self.assertIn("python/stragg/_base.py:2: stragg._base imports stragg.top", out)
        self.assertIn("stragg.top imports stragg._", out)

    def test_from_package_import_module_and_from_module_import_name(self) -> None:
        files = dict(CLEAN)
        files[PKG + "sub/leaf.py"] = "from stragg.top import main\n"  # top -> _reg -> sub
        rc, out = run_checker(files)
        self.assertEqual(rc, 1, out)
        self.assertIn("stragg.sub.leaf imports stragg.top", out)
        self.assertIn("stragg._reg imports stragg.sub", out)

    def test_a_name_of_a_packages_init_points_to_the_init(self) -> None:
        files = dict(CLEAN)
        files[PKG + "_base.py"] = "from stragg import f\n"  # f is a name of the __init__
        rc, out = run_checker(files)
        self.assertEqual(rc, 1, out)
        self.assertIn("python/stragg/_base.py:1: stragg._base imports stragg\n", out)

    def test_a_tree_without_the_package_is_an_error(self) -> None:
        rc, out = run_checker({"README.md": "no package\n"})
        self.assertEqual(rc, 2, out)
        self.assertIn("has no python/stragg/__init__.py", out)


if __name__ == "__main__":
    unittest.main()
