"""Torch-free cost model API and CLI (stragg.sim) against the papers' closed forms."""

from __future__ import annotations

import json
import math

import pytest
from stragg import schedule, sim

S, A, B = 2.0**30, 3e-6, 1 / 450e9


def close(x: float, y: float, tol: float = 1e-9) -> bool:
    return abs(x - y) <= tol * abs(y)


def test_ring_rhd_direct_closed_forms() -> None:
    for n in (2, 4, 8, 64):
        assert close(
            sim.simulate(schedule.build("ring", n), S, A, B).time, sim.closed_form.ring(n, S, A, B)
        )
        assert close(
            sim.simulate(schedule.build("rhd", n), S, A, B).time, sim.closed_form.rhd(n, S, A, B)
        )
        assert close(
            sim.simulate(schedule.build("direct", n), S, A, B).time,
            sim.closed_form.direct(n, S, A, B),
        )


def test_stragglar_best_worst_case_with_straggler_delay() -> None:
    for n in (4, 8, 32):
        s = schedule.build("stragglar", n, straggler=1)
        worst = sim.simulate(s, S, A, B, straggler_delay=0.0).time
        assert close(worst, sim.closed_form.stragglar_worst(n, S, A, B))
        d = 1e-2
        best = sim.simulate(s, S, A, B, straggler_delay=d)
        assert close(best.time, d + sim.closed_form.stragglar_best(n, S, A, B))
        assert best.pre_arrival_time < d
        ring = sim.simulate(schedule.build("ring", n), S, A, B, straggler=1, straggler_delay=d).time
        assert best.time < ring
    # StragglAR's advantage over Ring approaches 2x at scale with a long delay (Fig. 6c).
    n = 256
    d = 1.0
    sar = sim.simulate(schedule.build("stragglar", n), S, A, B, straggler_delay=d).time - d
    ring = (
        sim.simulate(schedule.build("ring", n), S, A, B, straggler=n - 1, straggler_delay=d).time
        - d
    )
    assert 1.8 < ring / sar < 2.0


def test_optcc_slow_link_approaches_table3() -> None:
    p, l = 8, 1.5
    t = [
        sim.simulate(
            schedule.build("optcc", p, straggler=0, slowdown=l, segments=k), 1.0, 0.0, 1.0
        ).time
        for k in (4, 64)
    ]
    limit = sim.closed_form.optcc_single_limit(p, l)
    assert t[1] < t[0] and abs(t[1] / limit - 1) < 0.02
    assert abs(t[1] / sim.closed_form.optcc_t0(p) - p * l / ((p - 2) * l + 2)) < 0.03
    # Ring with the same slow link pays l on every round.
    ring = sim.simulate(
        schedule.build("ring", p), 1.0, 0.0, 1.0, slowdown=[l] + [1.0] * (p - 1)
    ).time
    assert close(ring, l * sim.closed_form.ring(p, 1.0, 0.0, 1.0))
    assert t[1] < ring


def test_ring_topology_and_short_circuit() -> None:
    n, m, b, d, r = 16, 1024.0, 1 / 100e9, 1e-6, 1e-7
    kw = {"ring_topology": True, "hop_delay": d, "reconfig_delay": r}
    ring = sim.simulate(schedule.build("ring", n), m, 0.0, b, **kw).time
    rd_static = sim.simulate(schedule.build("rhd", n), m, 0.0, b, **kw).time
    assert ring <= rd_static
    sc = schedule.build("short_circuit", n, nbytes=m, beta=b, hop_delay=d, reconfig_delay=r)
    t = sim.simulate(sc, m, 0.0, b, **kw).time
    assert t < ring
    assert close(t, sim.closed_form.sc_choose(n, m, 0.0, b, d, r)["time"])


def test_bad_arguments() -> None:
    s = schedule.build("ring", 4)
    with pytest.raises(ValueError):
        sim.simulate(s, S, A, B, arrival=[0.0, 1.0])
    with pytest.raises(ValueError):
        sim.simulate(s, S, A, B, straggler_delay=1.0)  # ring has no straggler
    with pytest.raises(ValueError):
        sim.simulate(s, S, A, B, mode="warp")


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        sim.main(
            ["ring", "stragglar", "--n", "8", "--nbytes", "64MiB", "--delay", "0.01", "--json"]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    by = {r["algo"]: r for r in rows}
    assert by["stragglar"]["after_arrival_seconds"] < by["ring"]["after_arrival_seconds"]
    assert math.isclose(
        by["ring"]["time_seconds"], 0.01 + sim.closed_form.ring(8, 64 * 2**20, 3e-6, 1 / 450e9)
    )
    assert sim.main(["optcc", "--n", "8", "--slowdown", "2", "--param", "segments=16"]) == 0
    assert "optcc" in capsys.readouterr().out
