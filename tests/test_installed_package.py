"""The tests run against stragg as users install it: the wheel in site-packages, not the tree.

scripts/setup.sh installs the wheel it builds; STRAGG_EDITABLE=1 installs it editable instead,
which this test then reports (CI never sets it).
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.needs_backend

REPO = Path(__file__).resolve().parent.parent


def test_stragg_is_imported_from_site_packages_not_the_source_tree() -> None:
    import stragg
    import stragg._C

    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    for mod in (stragg, stragg._C):
        where = Path(os.path.realpath(mod.__file__))
        assert site in where.parents, (
            f"{mod.__name__} imported from {where}, not from {site}: run scripts/setup.sh "
            "without STRAGG_EDITABLE=1 (the tests must import what users install)"
        )
        assert REPO / "python" not in where.parents, where
