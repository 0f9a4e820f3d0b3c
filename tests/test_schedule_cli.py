"""The issue's CLI form ``python -m stragg.schedule ALGO -n N ...`` and the verifier's failures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from stragg import schedule

KEYS = {"algo", "n", "rounds", "verified", "generation_seconds"}


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stragg.schedule", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_subprocess_json_stragglar() -> None:
    p = run_cli("stragglar", "-n", "8", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert isinstance(doc, dict) and KEYS <= doc.keys()
    assert doc["algo"] == "stragglar" and doc["n"] == 8
    assert doc["rounds"] == schedule.build("stragglar", 8).num_rounds == 15
    assert doc["verified"] is True
    # How fast generation is belongs to benchmarks/schedule_gen.py, not to a shared 2-core VM.
    assert isinstance(doc["generation_seconds"], float) and doc["generation_seconds"] >= 0
    assert doc["post_arrival_rounds"] == 9 and doc["lower_bound"] == 9


def test_subprocess_json_optcc_all_options() -> None:
    p = run_cli(
        "optcc", "-n", "6", "--straggler", "2", "--slowdown", "2=1.5", "--segments", "4", "--json"
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    ref = schedule.build("optcc", 6, straggler=2, slowdown=1.5, segments=4)
    assert doc["rounds"] == ref.num_rounds and doc["verified"] is True
    assert doc["stragglers"] == [2] and doc["slowdown"] == {"2": 1.5} and doc["segments"] == 4


def test_subprocess_round_table() -> None:
    p = run_cli("ring", "-n", "4")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("ring allreduce: n=4")
    assert "r3" in p.stdout and "<2:c" in p.stdout and "verified: ok" in p.stdout


# Registered generators at a size each supports (the rhd halves need a power of two).
ALGOS = [
    "ring",
    "ring_reduce_scatter",
    "ring_allgather",
    "rd",
    "rhd",
    "rhd_reduce_scatter",
    "rhd_allgather",
    "direct",
    "direct_reduce_scatter",
    "direct_allgather",
    "bcast",
    "stragglar",
    "stragglar_direct",
    "optcc",
    "short_circuit",
    "host_level",
]


def test_every_registered_algorithm_is_covered() -> None:
    assert sorted(ALGOS) == sorted(schedule.algorithms())


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("n", [8, 7])
def test_in_process_json_every_algorithm(
    algo: str, n: int, capsys: pytest.CaptureFixture[str]
) -> None:
    if n == 7 and algo in ("rhd_reduce_scatter", "rhd_allgather", "short_circuit"):
        assert schedule.main([algo, "-n", str(n), "--json"]) == 2  # power-of-2 only
        assert "error:" in capsys.readouterr().err
        return
    assert schedule.main([algo, "-n", str(n), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert KEYS <= doc.keys() and doc["verified"] is True and doc["n"] == n
    assert doc["rounds"] == schedule.build(algo, n).num_rounds


def test_host_level_cli_params(capsys: pytest.CaptureFixture[str]) -> None:
    # Two ranks per host, StragglAR-direct across the 4 hosts with rank 5 (host 2) late.
    argv = ["host_level", "-n", "8", "--param", "ranks_per_host=2", "--param",
            "cross=stragglar_direct", "--straggler", "5", "--json"]
    assert schedule.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verified"] is True and doc["stragglers"] == [5]
    assert doc["params"]["cross"] == "stragglar_direct" and doc["params"]["ranks_per_host"] == 2
    ref = schedule.build("host_level", 8, ranks_per_host=2, cross="stragglar_direct", straggler=5)
    assert doc["rounds"] == ref.num_rounds and ref.verify()


def test_straggler_slowdown_segments(capsys: pytest.CaptureFixture[str]) -> None:
    assert schedule.main(["stragglar", "-n", "6", "--straggler", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["stragglers"] == [2] and doc["verified"]
    # --slowdown repeats; on non-OptCC schedules it sets the link model (rank_slowdown).
    argv = ["ring", "-n", "4", "--slowdown", "1=2", "--slowdown", "3=1.5", "--json"]
    assert schedule.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["slowdown"] == {"1": 2.0, "3": 1.5}
    s = schedule.cli_build("ring", 4, slowdown=[(1, 2.0)])
    assert s.rank_slowdown == [1.0, 2.0, 1.0, 1.0] and s.verify()
    # OptCC: the --slowdown ranks are the stragglers, --straggler first.
    s = schedule.cli_build("optcc", 8, straggler=4, slowdown=[(0, 1.5), (4, 3.0)], segments=2)
    assert s.stragglers == [4, 0] and s.rank_slowdown[4] == 3.0 and s.verify()
    argv = ["optcc", "-n", "8", "--slowdown", "0=1.5", "--slowdown", "4=3", "--with-schedule"]
    assert schedule.main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schedule"]["format"] == "stragg.schedule/1" and doc["stragglers"] == [0, 4]


def test_cli_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert schedule.main(["nope", "-n", "4"]) == 2
    assert "unknown algorithm" in capsys.readouterr().err
    assert schedule.main(["ring", "-n", "4", "--segments", "3"]) == 2  # ring has no segments
    assert "unknown parameter 'segments'" in capsys.readouterr().err
    assert schedule.main(["optcc", "-n", "4", "--straggler", "1", "--slowdown", "2=2"]) == 2
    assert schedule.main(["ring", "-n", "4", "--slowdown", "9=2"]) == 2
    with pytest.raises(SystemExit):
        schedule.main(["ring", "-n", "4", "--slowdown", "1.5"])  # needs R=L
    with pytest.raises(SystemExit):
        schedule.main(["ring"])  # -n is required
    capsys.readouterr()


# ---------------------------------------------------------------- the verifier can fail
def _broken(doc: dict, edit: str) -> dict:
    doc = json.loads(json.dumps(doc))
    steps = doc["steps"]
    if edit == "remove":  # drop one transfer
        steps[1]["transfers"].pop(0)
    elif edit == "duplicate":  # repeat a reducing step as a round of its own: counted twice
        dup = json.loads(json.dumps(steps[0]))
        for st in steps[1:]:
            st["round"] += 1
        dup["round"] = steps[0]["round"] + 1
        steps.insert(1, dup)
    elif edit == "copy_for_reduce":  # a reduce turned into a copy loses contributions
        steps[0]["transfers"][0][4] = "copy"
    elif edit == "wrong_chunk":
        t = steps[-1]["transfers"][0]
        t[2] = (t[2] + 1) % doc["num_chunks"]
    elif edit == "truncate":  # last step missing
        steps.pop()
    return doc


@pytest.mark.parametrize("algo", ["ring", "rhd", "stragglar", "bcast", "optcc"])
@pytest.mark.parametrize(
    "edit", ["remove", "duplicate", "copy_for_reduce", "wrong_chunk", "truncate"]
)
def test_verifier_rejects_broken_schedules(algo: str, edit: str) -> None:
    good = schedule.build(algo, 8)
    doc = json.loads(good.to_json())
    assert schedule.from_json(doc).verify()  # dict or str accepted
    bad = _broken(doc, edit)
    try:
        s = schedule.from_json(json.dumps(bad))
    except schedule.ScheduleError:
        assert edit == "wrong_chunk"  # a chunk run past the end is a structural error
        return
    v = s.verify()
    assert not v and not v.ok and v.error, f"{algo}/{edit} passed the verifier"


def test_from_json_structural_errors() -> None:
    doc = json.loads(schedule.build("ring", 4).to_json())
    dup = json.loads(json.dumps(doc))
    dup["steps"][0]["transfers"].append(dup["steps"][0]["transfers"][0])  # two sends by one rank
    with pytest.raises(schedule.ScheduleError):
        schedule.from_json(dup)
    with pytest.raises(ValueError):
        schedule.from_json('{"format": "nope"}')
