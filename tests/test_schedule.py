"""Torch-free schedule API and CLI (stragg.schedule)."""

from __future__ import annotations

import json
import math

import pytest
from stragg import schedule


@pytest.mark.parametrize(
    "algo", ["ring", "rhd", "direct", "stragglar", "bcast", "optcc", "rd", "stragglar_direct"]
)
def test_every_generator_verifies_for_small_n(algo: str) -> None:
    for n in range(2, 33):
        s = schedule.build(algo, n)
        v = s.verify()
        assert v, f"{algo} n={n}: {v.error}"
        assert v.ok and v.error == ""
        assert s.n == n


def test_stragglar_power_of_two_rounds_and_straggler_relabel() -> None:
    for n in (2, 4, 8, 16, 32, 64, 128, 256):
        s = schedule.build("stragglar", n, straggler=n // 3)
        assert s.num_post_arrival_rounds == n + int(math.log2(n)) - 2
        assert s.stragglers == [n // 3]
    s = schedule.build("stragglar", 8, straggler=3)
    assert s.num_rounds == 6 + 9
    for step in s.steps():
        if step["pre_arrival"]:
            assert all(3 not in (t["src"], t["dst"]) for t in step["transfers"])
    assert schedule.stragglar_round_lower_bound(10) == 12


def test_stragglar_other_n_meet_the_lower_bound_with_stored_schedules() -> None:
    # Non-power-of-2 n <= 255 expand a schedule found offline (docs/schedules.md); the straggler
    # can be any rank.
    for n in (3, 6, 14, 30, 62, 100, 254):
        s = schedule.build("stragglar", n, straggler=n // 2)
        assert s.num_post_arrival_rounds == schedule.stragglar_round_lower_bound(n)
        assert s.stragglers == [n // 2]
        assert s.verify().ok
        assert schedule.stragglar_construction(n).startswith("stored:")
    assert schedule.stragglar_construction(64) == "algorithm1"
    assert schedule.stragglar_construction(1000) == "two_chain"


def test_json_round_trip_and_str() -> None:
    s = schedule.build("optcc", 6, straggler=2, slowdown=1.5, segments=4)
    doc = json.loads(s.to_json())
    assert doc["format"] == "stragg.schedule/1"
    assert doc["n"] == 6 and doc["num_rounds"] == s.num_rounds
    assert doc["rank_slowdown"][2] == 1.5
    t = schedule.from_json(s.to_json(indent=2))
    assert t.to_json() == s.to_json()
    assert t.verify()
    text = str(schedule.build("ring", 4))
    assert "r3" in text and "<2:c" in text


def test_rank_program_and_chunk_ranges_for_the_executor() -> None:
    s = schedule.build("optcc", 5, straggler=4, slowdown=1.5, segments=2)
    ranges = s.chunk_ranges(1000)
    assert sum(length for _, length in ranges) == 1000
    assert all(ranges[i][0] + ranges[i][1] == ranges[i + 1][0] for i in range(len(ranges) - 1))
    assert len(set(s.chunk_weights)) == 2  # bubble chunks are smaller
    prog = s.rank_program(0)
    assert prog and all(op["send"] or op["recv"] for op in prog)
    peers = {op["send"][0] for op in prog if op["send"]}
    assert 4 in peers
    for op in prog:
        if op["recv"]:
            assert op["recv"][3] in ("reduce", "copy")


def test_stragglar_direct_rounds_chunks_and_model() -> None:
    from stragg import sim

    for n in (2, 3, 8, 13):
        for k in (1, 4):
            s = schedule.build("stragglar_direct", n, straggler=n // 2, segments=k)
            assert s.verify(), (n, k)
            assert s.num_post_arrival_rounds == k + 1
            assert s.num_chunks == (n - 1) * k
            assert s.stragglers == [n // 2]
            for step in s.steps():
                if step["pre_arrival"]:
                    assert all(n // 2 not in (t["src"], t["dst"]) for t in step["transfers"])
    # Post-arrival (k+1)(alpha + s*beta/k) once the straggler is later than the early ranks'
    # reduce-scatter: every link moves s/k per round.
    nbytes, alpha, beta, k = 8e6, 1e-4, 1e-8, 16
    s = schedule.build("stragglar_direct", 8, segments=k)
    delay = 1.0
    t = sim.simulate(s, nbytes, alpha, beta, straggler=7, straggler_delay=delay).time
    assert t - delay == pytest.approx((k + 1) * (alpha + nbytes * beta / k), rel=1e-6)
    with pytest.raises(ValueError, match="segments must be >= 1"):
        schedule.build("stragglar_direct", 4, segments=0)
    with pytest.raises(ValueError, match="needs n >= 2"):
        schedule.build("stragglar_direct", 1)


def test_errors_are_value_errors() -> None:
    with pytest.raises(ValueError, match="unknown algorithm"):
        schedule.build("nope", 4)
    with pytest.raises(ValueError, match="unknown parameter"):
        schedule.build("ring", 4, bogus=1)
    with pytest.raises(ValueError):
        schedule.build("stragglar", 4, straggler=7)
    with pytest.raises(ValueError):
        schedule.from_json("{}")


def test_cli_show_verify_rounds(capsys: pytest.CaptureFixture[str]) -> None:
    assert schedule.main(["show", "stragglar", "--n", "8"]) == 0
    out = capsys.readouterr().out
    assert "stragglar allreduce: n=8" in out and "post-arrival rounds=9" in out
    assert schedule.main(["show", "ring", "--n", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_rounds"] == 6
    assert schedule.main(["verify", "ring", "stragglar", "--n", "2..12", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 22 and all(r["ok"] for r in rows)
    assert schedule.main(["rounds", "stragglar", "--n", "4,8,16", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["post_arrival_rounds"] for r in rows] == [4, 9, 18]
    assert schedule.main(["show", "nope", "--n", "4"]) == 2
