"""The layer check (scripts/check_layers.py) fails where it should: run on small fake source trees
(--root) with an upward, a sideways and a relative upward include, a directory that is no layer,
and a clean tree. Run by CTest as check_layers_cases: python tests/cpp/check_layers_cases.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

CHECKER = Path(__file__).resolve().parents[2] / "scripts" / "check_layers.py"


def run_checker(files: dict[str, str]) -> tuple[int, str]:
    with tempfile.TemporaryDirectory(prefix="stragg-layers-") as tmp:
        root = Path(tmp)
        for rel, text in files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        proc = subprocess.run(
            [sys.executable, str(CHECKER), "--root", str(root)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return proc.returncode, proc.stdout + proc.stderr


# A tree that follows the rules: every include points to the same or a lower layer.
CLEAN = {
    "csrc/common/error.h": "#pragma once\n#include <string>\n",
    "csrc/transport/transport.h": '#pragma once\n#include "common/error.h"\n',
    "csrc/runtime/executor.h": '#pragma once\n#include "transport/transport.h"\n#include "x.h"\n',
    "csrc/session/session.cc": '#include "runtime/executor.h"\n#include "common/error.h"\n',
    "kernels/gpu_executor.h": '#pragma once\n#include "runtime/executor.h"\n',
    "csrc/backend/backend.cc": '#include "kernels/gpu_executor.h"\n#include "session/x.h"\n',
}


class CheckLayersTest(unittest.TestCase):
    def test_clean_tree_passes(self) -> None:
        rc, out = run_checker(CLEAN)
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"^check_layers: OK: 7 includes across layers in 6 files")

    def test_upward_include_fails_naming_file_line_include_and_layers(self) -> None:
        files = dict(CLEAN)
        files["csrc/transport/shm.cc"] = '#include <vector>\n\n#include "runtime/executor.h"\n'
        rc, out = run_checker(files)
        self.assertEqual(rc, 1, out)
        self.assertIn(
            'csrc/transport/shm.cc:3: #include "runtime/executor.h": transport (level 2) '
            "includes runtime (level 3), a higher layer",
            out,
        )
        self.assertIn("check_layers: FAILED: 1 problem(s)", out)

    def test_from_the_lowest_layer_and_in_angle_brackets(self) -> None:
        files = dict(CLEAN)
        files["csrc/common/log.h"] = "#pragma once\n  #  include <session/session.h>\n"
        rc, out = run_checker(files)
        self.assertEqual(rc, 1, out)
        self.assertIn("csrc/common/log.h:2:", out)
        self.assertIn("common (level 0) includes session (level 5), a higher layer", out)

    def test_kernels_and_relative_includes_are_checked(self) -> None:
        files = dict(CLEAN)
        files["kernels/host/device.cc"] = '#include "../../csrc/session/session.h"\n'
        files["csrc/core/ir.h"] = '#pragma once\n#include "../plan/planner.h"\n'
        rc, out = run_checker(files)
        self.assertEqual(rc, 1, out)
        self.assertIn("kernels/host/device.cc:1:", out)
        self.assertIn("kernels (level 4) includes session (level 5)", out)
        self.assertIn("csrc/core/ir.h:2:", out)
        self.assertIn("core (level 1) includes plan (level 4)", out)

    def test_sibling_layers_include_neither_each_other(self) -> None:
        files = dict(CLEAN)
        files["csrc/plan/planner.h"] = '#pragma once\n#include "kernels/gpu_executor.h"\n'
        rc, out = run_checker(files)
        self.assertEqual(rc, 1, out)
        self.assertIn("plan (level 4) includes kernels (level 4), a sibling layer", out)

    def test_a_directory_that_is_no_layer_fails(self) -> None:
        files = dict(CLEAN)
        files["csrc/extras/x.h"] = "#pragma once\n"
        rc, out = run_checker(files)
        self.assertEqual(rc, 1, out)
        self.assertIn("csrc/extras/: a directory that is no layer", out)


if __name__ == "__main__":
    unittest.main()
