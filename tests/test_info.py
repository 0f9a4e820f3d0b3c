"""`python -m stragg.info`: the bug-report summary (text and --json) and what it reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import _harness as h
import pytest

pytestmark = [pytest.mark.needs_backend, pytest.mark.stragg_only]


def _json(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    proc = h.run_module(tmp_path, "--json", *args, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_json_versions_build_and_host_facts(tmp_path: Path) -> None:
    import stragg
    import torch
    from stragg import _C

    info = _json(tmp_path)
    v = info["versions"]
    assert v["stragg"] == stragg.__version__
    assert v["torch"] == torch.__version__
    assert v["python"] == sys.version.split()[0]
    assert v["os"] and v["kernel"]
    b = info["build"]
    assert b["registered"] is True
    assert b["extension"]["loaded"] is True
    assert b["extension"]["cuda_allreduce_compiled"] is bool(_C.cuda_allreduce_compiled)
    assert Path(b["extension"]["path"]).name.startswith("_C")
    assert b["core_extension"]["loaded"] is True
    assert b["install"]["autoload_entry_point"] is True
    c = info["cuda"]
    assert c["available"] is torch.cuda.is_available()
    assert c["torch_cuda_build"] == torch.version.cuda
    shm = info["shared_memory"]
    st = os.statvfs("/dev/shm")
    assert shm["exists"] is True
    assert shm["size_bytes"] == st.f_blocks * st.f_frsize
    assert 0 <= shm["free_bytes"] <= shm["size_bytes"]
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    lim = info["limits"]
    assert lim["open_files"]["soft"] == (None if soft == resource.RLIM_INFINITY else soft)
    assert lim["cpus"] == os.cpu_count()
    t = info["transport"]
    assert t["setting"] == "auto"
    assert t["ranks_on_this_host"] == "shm"
    assert (
        t["host_identity"]["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    )


def test_settings_in_force_come_from_the_environment(tmp_path: Path) -> None:
    env = {"STRAGG_ALGO": "ring", "STRAGG_STRAGGLER": "dynamic", "STRAGG_TRANSPORT": "tcp",
           "STRAGG_TCP_HOST": "127.0.0.1", "STRAGG_SHM_SLOTS": "8"}  # fmt: skip
    info = _json(tmp_path, env=env)
    s = info["settings"]
    assert s["environment"] == env
    eff = s["effective"]
    assert eff["algo"] == "ring"
    assert eff["straggler"] == "dynamic"
    assert eff["shm_slots"] == "8"
    assert info["transport"]["setting"] == "tcp"
    assert info["transport"]["ranks_on_this_host"] == "tcp"
    assert info["transport"]["tcp_advertised_address"] == "127.0.0.1"
    idle = Path("/proc/sys/net/ipv4/tcp_slow_start_after_idle").read_text().strip()
    assert info["transport"]["tcp_slow_start_after_idle"] is (idle == "1")


def test_invalid_setting_is_reported_not_raised(tmp_path: Path) -> None:
    info = _json(tmp_path, env={"STRAGG_ALGO": "fastest"})
    err = info["settings"]["effective"]["error"]
    assert "STRAGG_ALGO='fastest' is not accepted (expected one of auto" in err
    text = h.run_module(tmp_path, env={"STRAGG_ALGO": "fastest"})
    assert text.returncode == 0, text.stderr
    assert "INVALID" in text.stdout and "STRAGG_ALGO='fastest'" in text.stdout


def test_text_report_has_every_section(tmp_path: Path) -> None:
    import torch

    proc = h.run_module(tmp_path, env={"STRAGG_PROFILE": "0"})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for title in ("Versions", "Build", "CUDA / NCCL", "Shared memory", "Limits", "Transport",
                  "Settings"):  # fmt: skip
        assert f"\n{title}\n" in f"\n{out}", title
    assert torch.__version__ in out
    assert "CUDA all_reduce compiled" in out
    assert "STRAGG_PROFILE" in out and "profiler    : off" in out.replace("profiler   ", "profiler")
    # `python -m stragg` is the same report.
    same = h.run_module(tmp_path, module="stragg", env={"STRAGG_PROFILE": "0"})
    assert same.returncode == 0, same.stderr
    assert same.stdout.splitlines()[0] == out.splitlines()[0]


@pytest.mark.slow
def test_probe_creates_a_group_on_this_host(tmp_path: Path) -> None:
    info = _json(tmp_path, "--probe")
    probe = info["transport"]["probe"]
    assert probe == {"world_size": 2, "transport": "shm", "algorithm": "auto", "ok": True}


@pytest.mark.slow
def test_probe_reports_a_failing_group(tmp_path: Path) -> None:
    # An invalid setting: group creation fails on both ranks; the report says why, exit code 0.
    info = _json(tmp_path, "--probe", env={"STRAGG_ALGO": "fastest"})
    probe = info["transport"]["probe"]
    assert probe["error"].startswith("rank 0: ValueError: stragg: STRAGG_ALGO='fastest'"), probe
