"""The issue's CLI forms of stragg.sim: ``ALGO -n N --bytes B --alpha A --beta BETA ...`` and
``--table stragglar`` (the StragglAR paper's scaling table), checked against the closed forms."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from stragg import schedule, sim

S, A, B = 2.0**30, 3e-6, 1 / 450e9
cf = sim.closed_form


def close(x: float, y: float, tol: float = 1e-9) -> bool:
    return abs(x - y) <= tol * abs(y)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stragg.sim", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_subprocess_json_single_object() -> None:
    p = run_cli(
        "stragglar", "-n", "8", "--bytes", "1GiB", "--alpha", "3e-6", "--beta", repr(B),
        "--delay", "0.01", "--json",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert isinstance(doc, dict) and {"algo", "n", "time_seconds"} <= doc.keys()
    assert doc["algo"] == "stragglar" and doc["n"] == 8
    # delay 10 ms >> reduce-scatter: the ideal case, delay + (n + log n - 2)(a + s b / (n-1)).
    assert close(doc["time_seconds"], 0.01 + cf.stragglar_best(8, S, A, B))
    assert close(doc["after_arrival_seconds"], cf.stragglar_best(8, S, A, B), 1e-6)
    assert doc["rounds"] == schedule.build("stragglar", 8).num_rounds


def test_subprocess_text_and_slowdown() -> None:
    p = run_cli("ring", "-n", "4", "--bytes", "1073741824", "--alpha", "0", "--beta", "1e-9",
                "--slowdown", "1=2")  # fmt: skip
    assert p.returncode == 0, p.stderr
    line = next(x for x in p.stdout.splitlines() if x.startswith("ring"))
    ms = float(line.split()[3])
    assert math.isclose(ms, 2 * cf.ring(4, 2.0**30, 0.0, 1e-9) * 1e3, rel_tol=1e-6)


def test_subprocess_table_json_matches_closed_forms() -> None:
    p = run_cli("--table", "stragglar", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["bytes"] == S and doc["alpha"] == A and close(doc["beta"], B)
    rows = doc["rows"]
    assert [r["n"] for r in rows] == [4, 8, 16, 32, 64, 128, 256]
    for r in rows:
        n = r["n"]
        assert close(r["ring_seconds"], cf.ring(n, S, A, B))
        assert close(r["rhd_seconds"], cf.rhd(n, S, A, B))
        assert close(r["stragglar_ideal_seconds"], cf.stragglar_best(n, S, A, B))
        assert close(r["stragglar_worst_seconds"], cf.stragglar_worst(n, S, A, B))
        assert r["stragglar_post_arrival_rounds"] == n + int(math.log2(n)) - 2
    # A couple of absolute values (ms): n = 8 and n = 256.
    by = {r["n"]: r for r in rows}
    assert by[8]["ring_seconds"] * 1e3 == pytest.approx(4.2177, abs=1e-4)
    # ideal n = 8: 9 (a + s b / 7); worst n = 256: 516 (a + s b / 255).
    assert by[8]["stragglar_ideal_seconds"] * 1e3 == pytest.approx(3.0948, abs=1e-4)
    assert by[256]["stragglar_worst_seconds"] * 1e3 == pytest.approx(6.3763, abs=1e-4)
    # StragglAR's ideal case approaches 2x Ring at scale, worst case is slower than Ring.
    assert 1.9 < by[256]["speedup_ideal_vs_ring"] < 2.0
    assert all(r["stragglar_worst_seconds"] > r["ring_seconds"] for r in rows)


def test_subprocess_table_text() -> None:
    p = run_cli("--table", "stragglar")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert "Ring" in lines[1] and "RHD" in lines[1] and "StragglAR ideal" in lines[1]
    assert "StragglAR worst" in lines[1]
    data = [x.split() for x in lines[2:]]
    assert [int(x[0]) for x in data] == [4, 8, 16, 32, 64, 128, 256]
    assert all(len(x) == 6 for x in data)
    assert float(data[-1][1]) == pytest.approx(cf.ring(256, S, A, B) * 1e3, abs=1e-3)


def test_in_process_forms(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["-n", "8", "--alpha", "3e-6", "--json"]
    assert sim.main(["rhd", *base, "--bytes", "1GiB", "--beta", repr(B)]) == 0
    a = json.loads(capsys.readouterr().out)
    assert sim.main(["rhd", *base, "--nbytes", "1073741824", "--bandwidth", "450e9"]) == 0
    b = json.loads(capsys.readouterr().out)
    assert close(a["time_seconds"], cf.rhd(8, S, A, B)) and close(
        a["time_seconds"], b["time_seconds"]
    )
    # Several algorithms / n: a list of objects.
    assert sim.main(["ring", "direct", "-n", "4,8", "--bytes", "64MiB", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["algo"], r["n"]) for r in rows] == [
        ("ring", 4),
        ("direct", 4),
        ("ring", 8),
        ("direct", 8),
    ]
    assert close(rows[3]["time_seconds"], cf.direct(8, 64 * 2**20, A, B))
    # Repeated --slowdown: the slowest involved link sets a round's time.
    argv = ["ring", "-n", "4", "--alpha", "0", "--beta", "1", "--bytes", "4"]
    assert sim.main([*argv, "--slowdown", "0=1.5", "--slowdown", "2=3", "--json"]) == 0
    assert close(json.loads(capsys.readouterr().out)["time_seconds"], 3 * cf.ring(4, 4.0, 0.0, 1.0))
    # OptCC takes the --slowdown ranks as its stragglers.
    argv = ["optcc", "-n", "8", "--alpha", "0", "--beta", "1", "--bytes", "1", "--json"]
    assert sim.main([*argv, "--slowdown", "3=1.5", "--segments", "64"]) == 0
    t = json.loads(capsys.readouterr().out)["time_seconds"]
    assert abs(t / cf.optcc_single_limit(8, 1.5) - 1) < 0.02
    # Table with other n and sizes.
    assert sim.main(["--table", "stragglar", "-n", "6,8", "--bytes", "1MiB", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["n"] for r in rows] == [6, 8]
    assert close(rows[1]["ring_seconds"], cf.ring(8, 2.0**20, A, B))


def test_sim_cli_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim.main(["nope", "-n", "4"]) == 2
    assert sim.main(["--table", "stragglar", "ring"]) == 2
    with pytest.raises(SystemExit):
        sim.main(["ring", "--beta", "1e-9", "--bandwidth", "1e9"])
    with pytest.raises(SystemExit):
        sim.main(["ring", "--bytes", "lots"])
    with pytest.raises(SystemExit):
        sim.main([])
    capsys.readouterr()


def test_sim_sizes_use_the_settings_parser(capsys: pytest.CaptureFixture[str]) -> None:
    """One size parser for stragg: KiB/MiB are powers of 2, KB/MB powers of 10, bare M is
    ambiguous and rejected (stragg.sim used to read 1M as 10**6)."""
    base = ["ring", "-n", "4", "--alpha", "0", "--beta", "1", "--json"]
    for text, value in (("1MiB", 2**20), ("1MB", 10**6), ("64 KiB", 65536), ("4096", 4096)):
        assert sim.main([*base, "--bytes", text]) == 0
        assert json.loads(capsys.readouterr().out)["bytes"] == value, text
    with pytest.raises(SystemExit):
        sim.main([*base, "--bytes", "1M"])
    assert "'m' is ambiguous" in capsys.readouterr().err
