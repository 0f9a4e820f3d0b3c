"""benchmarks/training.py, small: DDP training across 4 emulated hosts decides as it should.

One run of the benchmark (4 hosts at 200 Mbit/s, a small transformer, 60 steps, Gloo next to
stragg's defaults) in two scenarios:
- late: the rank on host 3 waits 60 ms before every gradient all_reduce (in DDP's comm hook);
  stragg's profiler adopts it as the straggler and runs StragglAR (or stragglar_direct) for it;
- nic: host 1's link runs at half rate; stragg's link probes name rank 1 as degraded (factor
  2 shaped, read above 1.2 when OptCC is adopted) and run OptCC for it.
In both, every step's loss equals Gloo's within 1e-5 (relative). Timings are not asserted (see
docs/benchmarks.md for the measured table). The profiler exchanges every 4 calls here and the
probes may take half the job's time, so that a 60-step job reaches its decisions; the defaults
are measured by the benchmark itself. Skips without network namespaces; FAILS then under
STRAGG_TEST_REQUIRE=1 (CI runs as root).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import _emu
import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow, pytest.mark.needs_backend]


def test_training_benchmark_adopts_the_late_rank_and_names_the_slow_nic(tmp_path: Path) -> None:
    _emu.emucluster()  # skips (or fails under STRAGG_TEST_REQUIRE=1) without namespaces
    cmd = [
        sys.executable, str(REPO / "benchmarks" / "training.py"),
        "--hosts", "4", "--rate", "200mbit", "--scenarios", "late,nic", "--backends", "gloo,stragg",
        "--steps", "60", "--tail", "10", "--delay-ms", "60", "--layers", "1", "--d-model", "128",
        "--vocab", "1024", "--model", "torch", "--timeout", "240",
        "--stragg-env", "STRAGG_PROFILE_EVERY=4", "--stragg-env", "STRAGG_PROBE_BUDGET=0.5",
        "--json", "--plot", str(tmp_path / "t.png"),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(proc.stdout.splitlines()[-1])
    (cluster,) = doc["clusters"]
    scen = {sc["name"]: sc for sc in cluster["scenarios"]}
    assert set(scen) == {"late", "nic"}

    late = scen["late"]
    assert late["late_rank"] == 3, late["late_rank"]
    (dec,) = late["backends"]["stragg"]["decided"]
    # Adopted (the plan check may undo it later where StragglAR measures slower than Ring: on
    # this shared VM that is noise, not the decision under test).
    assert any(d.get("straggler") == 3 for d in dec["decisions"]), dec
    assert dec["first_stragglar"] is not None, dec
    # StragglAR or, over this network, its pipelined direct variant when the model prefers it.
    assert re.fullmatch(r"stragglar(_direct)?\(3(,k=\d+)?\)", dec["first_stragglar"]["plan"]), dec

    nic = scen["nic"]
    assert nic["slow_ranks"] == [1], nic["slow_ranks"]
    (dec,) = nic["backends"]["stragg"]["decided"]
    assert list(dec["degraded_ranks"]) == ["1"], dec
    # OptCC adopted for rank 1 with a factor near the shaped 2 (probes read 1.4-2.7 for l = 2 on
    # this VM). The final factor follows the latest probes and is only asserted to still name
    # rank 1: on a machine short of CPU every link runs at the CPU's pace and a 2x link reads ~1.1.
    first = dec["first_optcc"]
    assert first is not None, dec
    m = re.fullmatch(r"optcc\(1=([0-9.]+),k=\d+\)", first["plan"])
    assert m is not None and 1.2 <= float(m.group(1)) <= 3.0, dec
    assert dec["profile_straggler"] is None, dec

    for sc in (late, nic):
        diff = sc["backends"]["stragg"]["loss_rel_diff"]
        assert diff is not None and diff <= 1e-5, (sc["name"], diff)
    assert (tmp_path / "t.png").stat().st_size > 10_000
