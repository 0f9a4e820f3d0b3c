"""Emulated clusters for the tests (tests/test_emucluster.py, tests/test_netns.py).

``emucluster()`` returns the stragg.emucluster module once it has shown that it can make a
cluster here; otherwise the test is skipped, or FAILS under STRAGG_TEST_REQUIRE=1 (CI runs as
root: a test that cannot create namespaces there is a broken CI, not a reason to skip).
``new_name(tag)`` gives a cluster name unique to this pytest process; clusters with such a name
whose pytest process is gone (killed earlier runs) are removed by ``emucluster()``.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from typing import Any

import _harness

_NAME_RE = re.compile(r"[a-z]+(\d+)x\d+")
_counter = itertools.count()
_checked: list[Any] = []


cannot = _harness.cannot  # skips the test, or fails it under STRAGG_TEST_REQUIRE=1


def new_name(tag: str = "t") -> str:
    return f"{tag}{os.getpid()}x{next(_counter)}"


def emucluster() -> Any:
    if _checked:
        return _checked[0]
    try:
        from stragg import emucluster as emu
    except Exception as exc:  # noqa: BLE001
        cannot(f"import stragg.emucluster failed: {exc}")
    if not sys.platform.startswith("linux"):
        cannot("network namespaces need Linux")
    try:
        emu.net.check_privileges()
    except emu.EmuClusterError as exc:
        cannot(f"cannot create network namespaces: {exc}")
    for name in emu.net.cluster_names():
        m = _NAME_RE.fullmatch(name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            emu.net.remove(name)
    try:
        with emu.EmuCluster(hosts=1, rate="100mbit", name=new_name("probe")):
            pass
    except emu.EmuClusterError as exc:
        cannot(f"cannot create an emulated cluster here: {exc}")
    _checked.append(emu)
    return emu


def tc_packets(cluster: Any, rank: int) -> tuple[int, int]:
    """(packets sent, packets dropped by the loss filter) on host rank's egress."""
    out = subprocess.run(
        ["tc", "-n", cluster.host(rank).netns, "-s", "class", "show", "dev", "eth0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    sent = re.search(r"class htb 1:1 .*?\n Sent \d+ bytes (\d+) pkt", out)
    dropped = re.search(r"class htb 1:2 .*?\(dropped (\d+)", out, re.DOTALL)
    assert sent and dropped, out
    return int(sent.group(1)), int(dropped.group(1))
