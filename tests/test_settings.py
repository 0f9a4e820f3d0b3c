"""Settings: one table for the environment, stragg.set_policy, stragg.profiler.configure and
pg_options; invalid values raise at init_process_group on every rank naming the variable, the
value and what is accepted; settings that must match raise naming both values; docs/settings.md's
table is the table."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import _harness as h

ROOT = Path(__file__).resolve().parent.parent


def test_settings_doc_table_is_generated_from_the_settings_table() -> None:
    import re

    from stragg._config import settings_markdown

    doc = (ROOT / "docs" / "settings.md").read_text()
    blocks = re.findall(r"<!-- settings-table: [^>]*-->\n(.*?)\n<!-- end settings-table -->", doc,
                        flags=re.S)
    assert len(blocks) == 1, "docs/settings.md must hold exactly one settings-table block"
    assert blocks[0] == settings_markdown(), (
        "docs/settings.md's settings table is stale: run "
        ".venv/bin/python scripts/update_settings_doc.py"
    )


def test_every_variable_read_anywhere_is_in_the_table() -> None:
    import stragg

    envs = {row["env"] for row in stragg.settings_table()}
    used: set[str] = set()
    import re

    for path in list((ROOT / "csrc").rglob("*.cc")) + list((ROOT / "python").rglob("*.py")):
        # Quoted names: what getenv / os.environ read (macros are not quoted).
        used |= set(re.findall(r"[\"'](STRAGG_[A-Z0-9_]+)[\"']", path.read_text()))
    # Build-time switches, the test harness' and the emulated cluster's own variables are not
    # settings of a group.
    not_settings = {"STRAGG_BACKEND_CUDA", "STRAGG_BACKEND_NCCL", "STRAGG_CUDA", "STRAGG_BUILD_TYPE",
                    "STRAGG_BUILD_JOBS", "STRAGG_TORCH", "STRAGG_EMUCLUSTER_STATE_DIR"}
    missing = {u for u in used - envs - not_settings if not u.startswith("STRAGG_TEST")}
    assert not missing, f"variables read but not in the settings table: {sorted(missing)}"


def test_python_settings_are_validated_when_given() -> None:
    import stragg
    import stragg.profiler

    try:
        with pytest.raises(ValueError, match=r"stragg.set_policy\(algo='fastest'\)='fastest' is not "
                           r"accepted \(expected one of auto, ring"):
            stragg.set_policy(algo="fastest")
        with pytest.raises(ValueError, match="a rank of the group, auto, dynamic or none"):
            stragg.set_policy(straggler="sometimes")
        with pytest.raises(ValueError, match="L >= 1"):
            stragg.set_policy(slowdown={3: 0.5})
        with pytest.raises(ValueError, match=r"profile_adopt|0, 1\]"):
            stragg.profiler.configure(adopt_share=1.5)
        with pytest.raises(TypeError, match="unknown setting 'shm_slot'"):
            stragg.Options(shm_slot=3)
        with pytest.raises(ValueError, match="an integer from 1 to 1024"):
            stragg.Options(shm_slots=0)
        with pytest.raises(ValueError, match=r"streaming_bytes=\.\.\.\)='lots' is not accepted "
                           r"\(expected a size \(0: never\)\)"):
            stragg.Options(streaming_bytes="lots")
        stragg.set_policy(slowdown={3: 2.0})
        assert stragg._config.effective_settings()["slowdown"] == "3=2"
    finally:
        stragg.reset_policy()


def _init_only(rank: int, ws: int) -> None:
    h.init_process_group(rank, ws)


@pytest.mark.parametrize(
    "variable, value, expected",
    [
        ("STRAGG_SHM_SLOTS", "0", "STRAGG_SHM_SLOTS='0' is not accepted (expected an integer from 1 to 1024)"),
        ("STRAGG_SHM_SLOT_BYTES", "1M", "STRAGG_SHM_SLOT_BYTES='1M' is not accepted"),
        ("STRAGG_ALGO", "fastest", "STRAGG_ALGO='fastest' is not accepted (expected one of auto"),
        ("STRAGG_PROFILE_EVERY", "0", "STRAGG_PROFILE_EVERY='0' is not accepted"),
        ("STRAGG_STRAGGLER", "7", "STRAGG_STRAGGLER=7 is not a rank of this group of 2"),
    ],
)
def test_invalid_environment_raises_at_init_on_every_rank(
    variable: str, value: str, expected: str
) -> None:
    res = h.run_ranks(2, _init_only, init=False, destroy=False, pg_timeout_s=20, env={variable: value})
    for r in res:
        assert r.raised, res.describe()
        assert expected in r.describe(), res.describe()
        assert "ValueError" in r.exc_mro or "DistBackendError" in r.exc_mro, res.describe()


def _init_with_rank_env(rank: int, ws: int) -> None:
    os.environ["STRAGG_SHM_SLOTS"] = "4" if rank == 0 else "8"
    h.init_process_group(rank, ws)


def test_settings_that_must_match_raise_naming_both_values() -> None:
    res = h.run_ranks(2, _init_with_rank_env, init=False, destroy=False, pg_timeout_s=20)
    for r in res:
        assert r.raised, res.describe()
        assert "STRAGG_SHM_SLOTS mismatch: rank 0 uses '4', rank 1 uses '8'" in r.describe(), (
            res.describe()
        )


def _pg_options(rank: int, ws: int) -> dict[str, Any]:
    import stragg

    out: dict[str, Any] = {}
    for name, opts in (("dict", {"algo": "rhd"}), ("options", stragg.Options(algo="direct"))):
        g = dist.new_group(list(range(ws)), backend="stragg", pg_options=opts)
        t = torch.full((1000,), float(rank + 1))
        dist.all_reduce(t, group=g)
        assert torch.equal(t, torch.full((1000,), float(ws * (ws + 1) // 2)))
        out[name] = (stragg.backend_stats(g)["algorithm"], stragg.recent_calls(g)[-1]["algorithm"])
        dist.destroy_process_group(g)
    return out


def test_pg_options_configure_one_group() -> None:
    res = h.run_ranks(3, _pg_options)
    for v in res.values():
        assert v["dict"] == ("rhd", "rhd"), v
        assert v["options"] == ("direct", "direct"), v


def test_gloo_socket_ifname_is_the_default_interface_list_and_stragg_socket_ifname_overrides_it(
    monkeypatch,
) -> None:
    from stragg._config import effective_settings, raw_settings

    monkeypatch.delenv("STRAGG_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    assert effective_settings()["socket_ifname"] == ""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth1,ib0")
    assert effective_settings()["socket_ifname"] == "=eth1,ib0"  # Gloo's are exact names
    assert ("socket_ifname", "=eth1,ib0", "GLOO_SOCKET_IFNAME") in raw_settings()
    monkeypatch.setenv("STRAGG_SOCKET_IFNAME", "^docker")
    assert effective_settings()["socket_ifname"] == "^docker"
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0,,x")
    monkeypatch.delenv("STRAGG_SOCKET_IFNAME")
    with pytest.raises(ValueError, match="GLOO_SOCKET_IFNAME='=eth0,,x' is not accepted"):
        effective_settings()
