"""Shared fixtures for the stragg Python test suite.

Environment knobs:
- STRAGG_TEST_BACKEND: backend under test (default "stragg"; "gloo" validates harness and tests).
- STRAGG_TEST_REQUIRE=1: fail (instead of skip) when the backend is "stragg" and
  ``import stragg`` does not work. CI should set it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import _harness

BACKEND = _harness.backend_name()
_IMPORT_ERROR = _harness.stragg_import_error() if BACKEND == "stragg" else None


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = "importable" if _IMPORT_ERROR is None else f"NOT importable ({_IMPORT_ERROR})"
    lines = [f"stragg tests: backend under test = {BACKEND!r}; {_harness.python_info()}"]
    if BACKEND == "stragg":
        lines.append(f"stragg tests: stragg is {state}")
    return lines


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Slow tests first (stable: files keep their order): with pytest-xdist they then run beside
    # the many short ones instead of leaving one worker alone with a long tail.
    items.sort(key=lambda item: "slow" not in item.keywords)
    if BACKEND == "stragg" and _IMPORT_ERROR is not None:
        if os.environ.get("STRAGG_TEST_REQUIRE") == "1":
            return  # let every test fail loudly on the import
        skip = pytest.mark.skip(reason=f"import stragg failed: {_IMPORT_ERROR}")
        for item in items:
            if "needs_backend" in item.keywords:
                item.add_marker(skip)
    if BACKEND != "stragg":
        skip = pytest.mark.skip(reason=f"stragg-specific (STRAGG_TEST_BACKEND={BACKEND})")
        for item in items:
            if "stragg_only" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def backend() -> str:
    return BACKEND


@pytest.fixture(autouse=True)
def no_leaked_processes_or_shm() -> Iterator[None]:
    """After every test: no new child processes, no new /dev/shm entries containing "stragg"
    made by this test's processes."""
    shm_before = _harness.shm_entries()
    children_before = _harness.child_pids()
    yield
    leaked = _harness.wait_shm_clean(shm_before, keep=_harness.own_entries)
    helpers = {_resource_tracker_pid(), _harness.forkserver_pid()}
    stray = sorted(_harness.child_pids() - children_before - helpers)
    for pid in stray:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    _harness.assert_no_leaks(leaked, stray)


def _resource_tracker_pid() -> int | None:
    """multiprocessing's resource tracker is a long-lived helper of the test process itself."""
    try:
        from multiprocessing import resource_tracker

        pid = getattr(resource_tracker._resource_tracker, "_pid", None)
    except Exception:  # noqa: BLE001  # pragma: no cover
        return None
    return pid if isinstance(pid, int) else None
