"""The harness's own rules: which /dev/shm entries are this test run's to answer for."""

from __future__ import annotations

import os
import subprocess

import _harness as h


def test_shm_entries_of_other_processes_are_not_this_tests_leak() -> None:
    me = os.getpid()
    child = subprocess.Popen(["sleep", "30"])
    try:
        names = {
            f"stragg-{me}-g0-r0",  # made by this process
            f"stragg-{child.pid}-g1-r0",  # by a live child (a torchrun job's rank)
            "stragg-legacy-name",  # no creator pid: kept, to be safe
            "stragg-1-g0-r0",  # pid 1 is nobody's child here: another user's run
        }
        assert h.own_entries(names) == names - {"stragg-1-g0-r0"}
    finally:
        child.kill()
        child.wait()
