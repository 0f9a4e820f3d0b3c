"""Straggler benchmark: all_reduce while one rank arrives late, StragglAR vs Ring vs Gloo.

    python benchmarks/straggler.py                       # n = 4, 1/16/64 MiB, delays 0,auto
    python benchmarks/straggler.py --ranks 8 --sizes 1MiB,64MiB --delays 0,5ms,auto,auto*2
    python benchmarks/straggler.py --json > straggler.json

The script spawns the ranks itself (torch.multiprocessing, start method 'spawn'). Every rank
initialises the default group with Gloo (control only: start synchronisation, gathering the
timestamps, result checks) and creates one group per algorithm under test, in the same order on
every rank:

    stragg-ring               STRAGG_ALGO=ring       STRAGG_STRAGGLER=none
    stragg-stragglar          STRAGG_ALGO=stragglar  STRAGG_STRAGGLER=<--straggler>
    gloo                      dist.new_group(backend="gloo")
    stragg-stragglar-dynamic  STRAGG_ALGO=stragglar  STRAGG_STRAGGLER=dynamic  (created last; when
                              the installed stragg rejects "dynamic" the row is skipped, with a note)

One iteration of algorithm A with injected delay D (straggler s, default rank n-1):
  1. every rank refills its buffer (outside the timed region);
  2. synchronised start: each rank contributes monotonic() + --start-margin to a MAX all_reduce on
     the control group and sleeps until that common instant T (CLOCK_MONOTONIC is one clock for
     all processes of the host); every rank records t0 = monotonic() on waking;
  3. the straggler sleeps until T + D, records its arrival ta = monotonic() and calls all_reduce;
     the other ranks call all_reduce at once (so StragglAR's pre-arrival reduce-scatter overlaps D);
  4. every rank records t_end = monotonic() when its all_reduce has completed;
  5. (t0, ta, t_end, result-ok) of all ranks are gathered on the control group, outside the timing.

  total_s        = max over the non-stragglers of (t_end - t0)   (their call to completion)
  post_arrival_s = max over the non-stragglers of (t_end - ta_s) (the straggler's call to completion)
  arrival_s      = ta_s - max over the non-stragglers of t0       (the delay as it really happened)

A measured iteration in which some rank started more than --late-limit (1 ms) after the agreed
instant (the straggler: after instant + D) is repeated, so that scheduler hiccups of this
oversubscribed setting do not masquerade as algorithm time (the count is reported).
Reported: median over the measured iterations, with min and max. The algorithms are interleaved
iteration by iteration (the order rotates) so that machine noise hits all of them alike. The first
warm-up iteration of every (size, delay, algorithm) is checked exactly against the expected sum
(integer-valued float32 data, exact in any summation order); a mismatch aborts the run.

"auto" delay = the ring's reduce-scatter time, measured per size before the delayed runs: the
median stragg-ring all_reduce time (no delay) / 2, since the reduce-scatter is n-1 of the ring's
2(n-1) equal steps. "auto*F" scales it.

Model: alpha (per round) and beta (per byte) are fitted by least squares (relative error) to the
stragg-ring post-arrival times of all sizes with stragg.sim.simulate(ring), as
benchmarks/allreduce.py does. Then
  stragg-ring:      model_post_arrival_s = simulated ring time (the ring cannot start before the
                    straggler arrives);
  stragg-stragglar: model_post_arrival_s = simulate(stragglar, straggler_delay=arrival_s).time -
  (and -dynamic)    arrival_s (the simulator's clock starts when the early ranks arrive);
  gloo:             null (Gloo's algorithm is not modelled).

With --json, stdout gets exactly one JSON list of rows, each with at least
{"n", "bytes", "delay_s", "algo", "total_s", "post_arrival_s", "model_post_arrival_s"}; everything
else goes to stderr.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

# Python puts this script's directory first on sys.path (also in the spawned ranks): the
# sibling _common.py is found from any working directory; stragg itself is the installed one.
from _common import (
    ELEM,
    Stats,
    eprint,
    fit_ring_alpha_beta,
    import_stragg,
    make_data,
    mismatch_detail,
    parse_sizes,
    spawn_and_collect,
    stragg_stats,
)

RING = "stragg-ring"
STRAGGLAR = "stragg-stragglar"
DYNAMIC = "stragg-stragglar-dynamic"
GLOO = "gloo"
ALL_ALGOS = [STRAGGLAR, DYNAMIC, RING, GLOO]
STRAGG_ENV = {
    RING: ("ring", "none"),
    STRAGGLAR: ("stragglar", None),  # None: the configured straggler rank
    DYNAMIC: ("stragglar", "dynamic"),
}
DEFAULT_SIZES = "1MiB,16MiB,64MiB"
DEFAULT_DELAYS = "0,auto"
AUTO_METHOD = (
    "auto = median stragg-ring all_reduce time without delay / 2 "
    "(the ring reduce-scatter: n-1 of its 2(n-1) steps), measured per size"
)
TOLERANCE = 0.15  # the "within 15% of the model"
GLOO_TARGET = 1.25  # end-to-end speedup over gloo at 64 MiB with D >= reduce-scatter time
GLOO_TARGET_BYTES = 64 << 20


@dataclass(frozen=True)
class Delay:
    """A --delays entry: a fixed delay in seconds, or a multiple of the measured 'auto' delay."""

    text: str
    seconds: float = 0.0
    auto_factor: float | None = None

    def resolve(self, auto_s: float) -> float:
        return self.seconds if self.auto_factor is None else self.auto_factor * auto_s


@dataclass
class Config:
    ranks: int
    sizes: list[int]
    delays: list[Delay]
    algos: list[str]
    straggler: int
    iters: int
    warmup: int
    calib_iters: int
    start_margin_s: float
    late_limit_s: float
    timeout_s: float
    json: bool
    notes: list[str] = field(default_factory=list)


class VerificationError(RuntimeError):
    pass


_DELAY_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(s|ms|us)?\s*$")
_AUTO_RE = re.compile(
    r"^\s*(?:([0-9]*\.?[0-9]+)\s*\*\s*auto|auto\s*(?:\*\s*([0-9]*\.?[0-9]+))?)\s*$", re.IGNORECASE
)


def parse_delay(text: str) -> Delay:
    """'0', '0.01', '5ms', '250us', 'auto', 'auto*2', '0.5*auto'."""
    m = _AUTO_RE.match(text)
    if m:
        factor = float(m.group(1) or m.group(2) or 1.0)
        return Delay(text.strip(), auto_factor=factor)
    m = _DELAY_RE.match(text)
    if not m:
        raise ValueError(f"bad delay {text!r}: use seconds (0.01), 5ms, 250us, auto or auto*2")
    scale = {"s": 1.0, None: 1.0, "ms": 1e-3, "us": 1e-6}[m.group(2)]
    return Delay(text.strip(), seconds=float(m.group(1)) * scale)


def parse_delays(text: str) -> list[Delay]:
    return [parse_delay(p) for p in text.split(",") if p.strip()]


def _wait_until(deadline: float) -> None:
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(left)


def _new_stragg_group(algo: str, straggler: int, timeout: datetime.timedelta) -> Any:
    """dist.new_group(backend="stragg") with STRAGG_ALGO/STRAGG_STRAGGLER set for this group only."""
    env_algo, env_straggler = STRAGG_ENV[algo]
    saved = {k: os.environ.get(k) for k in ("STRAGG_ALGO", "STRAGG_STRAGGLER", "STRAGG_PROFILE")}
    os.environ["STRAGG_ALGO"] = env_algo
    os.environ["STRAGG_STRAGGLER"] = str(straggler) if env_straggler is None else env_straggler
    # The fixed-algorithm groups are measured without the profiler's exchanges and link probes;
    # the dynamic group keeps it: its wait-or-proceed window learns from the recent delays.
    os.environ["STRAGG_PROFILE"] = "1" if algo == DYNAMIC else "0"
    try:
        return dist.new_group(backend="stragg", timeout=timeout)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def worker(rank: int, cfg: Config, result_path: str) -> None:
    if cfg.json:
        os.dup2(2, 1)  # the parent's stdout carries the JSON document only
        sys.stdout = sys.stderr
    torch.set_num_threads(1)  # ranks share the cores
    n, s = cfg.ranks, cfg.straggler
    stragg_mod, why = import_stragg()
    if stragg_mod is None:
        raise RuntimeError(f"rank {rank}: import stragg failed: {why}")

    timeout = datetime.timedelta(seconds=cfg.timeout_s)
    dist.init_process_group("gloo", rank=rank, world_size=n, timeout=timeout)
    ctrl = dist.group.WORLD

    # Same creation order on every rank; the dynamic group (which may be rejected) comes last so
    # that a rejection cannot shift the others.
    groups: dict[str, Any] = {RING: _new_stragg_group(RING, s, timeout)}
    if STRAGGLAR in cfg.algos:
        groups[STRAGGLAR] = _new_stragg_group(STRAGGLAR, s, timeout)
    if GLOO in cfg.algos:
        groups[GLOO] = dist.new_group(backend="gloo", timeout=timeout)
    notes: list[str] = []
    if DYNAMIC in cfg.algos:
        err = ""
        try:
            groups[DYNAMIC] = _new_stragg_group(DYNAMIC, s, timeout)
        except (ValueError, RuntimeError) as e:
            err = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        ok = torch.tensor([0.0 if err else 1.0], dtype=torch.float64)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=ctrl)
        if ok.item() < 1.0:
            groups.pop(DYNAMIC, None)  # (a group created on some ranks only is left unused)
            errs: list[Any] = [None] * n
            dist.all_gather_object(errs, err, group=ctrl)
            first = next((e for e in errs if e), "rejected on some rank")
            kind = "not supported" if "STRAGG_STRAGGLER" in first else "could not be created"
            notes.append(
                f"{DYNAMIC}: skipped, STRAGG_STRAGGLER=dynamic {kind} by this stragg build ({first})"
            )
    algos = [a for a in cfg.algos if a in groups]

    stats0 = {a: stragg_stats(stragg_mod, g) for a, g in groups.items() if a != GLOO}
    issued = {a: 0 for a in groups}
    if rank == 0:
        for a, st in stats0.items():
            keep = {
                k: st.get(k) for k in ("transport", "algorithm", "straggler", "error") if k in st
            }
            eprint(f"# {a}: backend_stats {json.dumps(keep, sort_keys=True)}")
        for note in notes:
            eprint(f"# NOTE {note}")

    def run_iter(
        algo: str,
        delay: float,
        src: torch.Tensor,
        expected: torch.Tensor,
        buf: torch.Tensor,
        check: bool,
    ) -> dict[str, float]:
        g = groups[algo]
        buf.copy_(src)
        start = torch.tensor([time.monotonic() + cfg.start_margin_s], dtype=torch.float64)
        dist.all_reduce(start, op=dist.ReduceOp.MAX, group=ctrl)
        t_start = float(start.item())
        _wait_until(t_start)
        t0 = time.monotonic()
        if rank == s:
            _wait_until(t_start + delay)
        ta = time.monotonic()
        dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=g)
        t_end = time.monotonic()
        issued[algo] += 1
        agreed = -3.0  # not dynamic
        window = agreement = -1.0
        if algo == DYNAMIC:  # which straggler the ranks agreed on (-1: none, plain Ring)
            agreed = float(stragg_stats(stragg_mod, g).get("last_straggler", -4))
            last_call = stragg_mod.recent_calls(g)[-1]
            window = float(last_call.get("window_s", -1.0))
            agreement = float(last_call.get("agreement_s", -1.0))
        local_bad = check and not torch.equal(buf, expected)
        rec = torch.zeros(n, 7, dtype=torch.float64)
        rec[rank] = torch.tensor(
            [t0, ta, t_end, 1.0 if local_bad else 0.0, agreed, window, agreement],
            dtype=torch.float64,
        )
        dist.all_reduce(rec, op=dist.ReduceOp.SUM, group=ctrl)  # = all_gather of the rows
        bad_ranks = [r for r in range(n) if rec[r, 3] > 0]
        if bad_ranks:
            detail = mismatch_detail(buf, expected) if local_bad else ""
            details: list[Any] = [None] * n
            dist.all_gather_object(details, detail, group=ctrl)
            per_rank = "; ".join(f"rank {r}: {details[r]}" for r in bad_ranks)
            raise VerificationError(
                f"{algo} all_reduce(SUM, float32, {buf.numel() * ELEM} bytes, {n} ranks, "
                f"straggler {s} delayed {delay * 1e3:.3f} ms) returned wrong results on ranks "
                f"{bad_ranks} ({per_rank})"
            )
        others = [r for r in range(n) if r != s]
        ta_s = float(rec[s, 1])
        # How late the last rank started against the agreed instant (the straggler: against
        # T + D), e.g. because the start agreement took longer than the margin or a descheduled
        # process woke late. Such iterations are repeated (see --late-limit).
        late = max(max(float(rec[r, 0]) - t_start for r in others), ta_s - (t_start + delay))
        return {
            "late": late,
            "total": max(float(rec[r, 2] - rec[r, 0]) for r in others),
            "post": max(float(rec[r, 2]) - ta_s for r in others),
            "arrival": ta_s - max(float(rec[r, 0]) for r in others),
            "straggler_post": float(rec[s, 2]) - ta_s,
            "start_skew": float(rec[:, 0].max() - rec[:, 0].min()),
            # agreed straggler if all ranks agree, else -5
            "agreed": float(rec[0, 4]) if bool((rec[:, 4] == rec[0, 4]).all()) else -5.0,
            # dynamic: the wait-or-proceed window used, and the agreement protocol's cost on the
            # rank that arrived last (it waits for nobody: a few small messages)
            "window": float(rec[0, 5]),
            "protocol": float(rec[s, 6]),
        }

    rows: list[dict[str, Any]] = []
    for nbytes in cfg.sizes:
        src, expected, buf = make_data(nbytes, rank, n)
        # Calibration (also the ring's warm-up): stragg-ring without delay -> "auto" delay.
        calib: list[float] = []
        for i in range(cfg.warmup + cfg.calib_iters):
            r = run_iter(RING, 0.0, src, expected, buf, check=(i == 0))
            if i >= cfg.warmup:
                calib.append(r["total"])
        ring_time = Stats.of(calib).median
        rs_s = ring_time / 2.0
        if rank == 0:
            eprint(
                f"# {n} ranks, {nbytes} B: stragg-ring {ring_time * 1e3:.3f} ms without delay "
                f"-> reduce-scatter (auto) {rs_s * 1e3:.3f} ms"
            )
        for d in cfg.delays:
            delay = d.resolve(rs_s)
            for i in range(cfg.warmup):
                for a in algos:
                    run_iter(a, delay, src, expected, buf, check=(i == 0))
            samples: dict[str, list[dict[str, float]]] = {a: [] for a in algos}
            repeats = {a: 0 for a in algos}
            for i in range(cfg.iters):
                k = i % len(algos)
                for a in algos[k:] + algos[:k]:
                    x = run_iter(a, delay, src, expected, buf, check=False)
                    # Same decision on every rank: `late` comes from the gathered timestamps.
                    while x["late"] > cfg.late_limit_s and repeats[a] < cfg.iters:
                        repeats[a] += 1
                        x = run_iter(a, delay, src, expected, buf, check=False)
                    samples[a].append(x)
            for a in algos:
                tot = Stats.of([x["total"] for x in samples[a]])
                post = Stats.of([x["post"] for x in samples[a]])
                arr = Stats.of([x["arrival"] for x in samples[a]])
                row: dict[str, Any] = {
                    "n": n,
                    "bytes": nbytes,
                    "delay_s": delay,
                    "algo": a,
                    "total_s": tot.median,
                    "post_arrival_s": post.median,
                    "model_post_arrival_s": None,
                    "total_min_s": tot.minimum,
                    "total_max_s": tot.maximum,
                    "post_arrival_min_s": post.minimum,
                    "post_arrival_max_s": post.maximum,
                    "arrival_s": arr.median,
                    "straggler_post_s": Stats.of([x["straggler_post"] for x in samples[a]]).median,
                    "start_skew_s": Stats.of([x["start_skew"] for x in samples[a]]).median,
                    "start_late_max_s": max(x["late"] for x in samples[a]),
                    "late_repeats": repeats[a],
                    "delay_spec": d.text,
                    "reduce_scatter_s": rs_s,
                    "ring_calib_s": ring_time,
                    "straggler": s,
                    "iters": tot.count,
                    "warmup": cfg.warmup,
                    "verified": cfg.warmup >= 1,
                    "dtype": "float32",
                    "op": "sum",
                }
                if a == DYNAMIC:
                    ag = [int(x["agreed"]) for x in samples[a]]
                    row["dynamic_agreed_straggler"] = {str(v): ag.count(v) for v in sorted(set(ag))}
                    row["dynamic_window_s"] = Stats.of([x["window"] for x in samples[a]]).median
                    proto = Stats.of([x["protocol"] for x in samples[a]])
                    row["protocol_s"] = proto.median
                    row["protocol_min_s"] = proto.minimum
                    row["protocol_max_s"] = proto.maximum
                rows.append(row)
                if rank == 0:
                    eprint(
                        f"  {nbytes:>11d} B  D {delay * 1e3:9.3f} ms ({d.text:>6})  {a:<25} "
                        f"total {tot.median * 1e3:9.3f} ms  post-arrival {post.median * 1e3:9.3f}"
                        f" ms  [{post.minimum * 1e3:.3f}, {post.maximum * 1e3:.3f}]"
                    )
        del src, expected, buf

    for a, g in groups.items():
        if a == GLOO:
            continue
        st = stragg_stats(stragg_mod, g)
        a0, a1 = stats0[a].get("allreduce_calls"), st.get("allreduce_calls")
        for r in rows:
            if r["algo"] == a:
                r["transport"] = st.get("transport")
                r["stragg_algorithm"] = st.get("algorithm")
        if st.get("transport") != "shm" or (
            isinstance(a0, int) and isinstance(a1, int) and a1 - a0 < issued[a]
        ):
            notes.append(
                f"WARNING {a}: transport {st.get('transport')!r}, allreduce_calls "
                f"{a0}->{a1} for {issued[a]} all_reduces issued (delegated to Gloo?)"
            )
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump({"rows": rows, "notes": notes, "algos": algos}, f)
    dist.barrier(group=ctrl)
    for g in groups.values():
        dist.destroy_process_group(g)
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# model and report (parent process)


def fit_ring_model(rows: list[dict[str, Any]], n: int) -> dict[str, float] | None:
    """alpha, beta minimising the relative error of simulate(ring) vs the stragg-ring rows."""
    ring_rows = [r for r in rows if r["algo"] == RING]
    fit = fit_ring_alpha_beta(
        n, [r["bytes"] for r in ring_rows], [r["post_arrival_s"] for r in ring_rows]
    )
    return None if fit is None else {"alpha_s": fit[0], "beta_s_per_byte": fit[1]}


def _dynamic_window_s() -> float | None:
    """STRAGG_DYNAMIC_WINDOW_US as the backend reads it (None: this stragg build has none)."""
    try:
        from stragg._config import backend_config

        us = backend_config().get("dynamic_window_us")
    except (ImportError, ValueError):
        return None
    return None if us is None or us < 0 else float(us) * 1e-6


def apply_model(
    rows: list[dict[str, Any]], n: int, straggler: int, model: dict[str, float] | None
) -> None:
    """Fills model_post_arrival_s (and model_total_s, model_worst_s) in place."""
    if model is None:
        return
    import stragg.schedule
    import stragg.sim

    alpha, beta = model["alpha_s"], model["beta_s_per_byte"]
    ring = stragg.schedule.build("ring", n)
    sg = stragg.schedule.build("stragglar", n, straggler=straggler)
    for r in rows:
        r["alpha_s"], r["beta_s_per_byte"] = alpha, beta
        nb = r["bytes"]
        arrival = max(r["arrival_s"], 0.0)
        window = r.get("dynamic_window_s")  # the window the dynamic group used (median)
        if r["algo"] == RING:
            t = stragg.sim.simulate(ring, nb, alpha, beta).time
            r["model_post_arrival_s"] = t
            r["model_total_s"] = arrival + t
        elif r["algo"] == DYNAMIC and window is not None and arrival <= window:
            # The last rank arrived within the agreement window: plain Ring once it is there.
            t = stragg.sim.simulate(ring, nb, alpha, beta).time
            r["model_post_arrival_s"] = t
            r["model_total_s"] = arrival + t
        elif r["algo"] in (STRAGGLAR, DYNAMIC):
            # Dynamic: the early ranks wait `window` for the last one, then start without it.
            w = window if r["algo"] == DYNAMIC and window is not None else 0.0
            res = stragg.sim.simulate(sg, nb, alpha, beta, straggler_delay=arrival - w)
            r["model_post_arrival_s"] = res.time - (arrival - w)
            r["model_total_s"] = w + res.time
            if r["algo"] == STRAGGLAR:
                r["model_worst_s"] = stragg.sim.simulate(
                    sg, nb, alpha, beta, straggler_delay=0.0
                ).time
            r["model_pre_arrival_s"] = res.pre_arrival_time


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Speedups within each (n, bytes, delay): vs stragg-ring (post-arrival) and vs gloo (total)."""
    by_key: dict[tuple[int, int, float], dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_key.setdefault((r["n"], r["bytes"], r["delay_s"]), {})[r["algo"]] = r
    for grp in by_key.values():
        ring, gloo = grp.get(RING), grp.get(GLOO)
        for r in grp.values():
            if ring is not None and r["post_arrival_s"] > 0:
                r["post_speedup_vs_ring"] = ring["post_arrival_s"] / r["post_arrival_s"]
                mr, ma = ring.get("model_post_arrival_s"), r.get("model_post_arrival_s")
                if mr and ma:
                    r["model_post_speedup_vs_ring"] = mr / ma
            if gloo is not None and r["total_s"] > 0:
                r["total_speedup_vs_gloo"] = gloo["total_s"] / r["total_s"]


def _ms(x: float | None, width: int = 9) -> str:
    return f"{x * 1e3:{width}.3f}" if x is not None else f"{'-':>{width}}"


def _x(x: float | None, width: int = 6) -> str:
    return f"{x:{width}.2f}" if x is not None else f"{'-':>{width}}"


def _agreed(r: dict[str, Any]) -> str:
    """'  agreed 3:10' for dynamic rows: the straggler the ranks agreed on, per iteration count
    (-1: nobody late within the window, plain Ring)."""
    ag = r.get("dynamic_agreed_straggler")
    if not ag:
        return ""
    return "  agreed " + " ".join(f"{k}:{v}" for k, v in ag.items())


def print_table(
    cfg: Config, rows: list[dict[str, Any]], model: dict[str, float] | None, notes: list[str]
) -> None:
    n = cfg.ranks
    print(
        f"# stragg straggler benchmark: {n} ranks, straggler rank {cfg.straggler}, float32 sum, "
        f"{os.cpu_count()} CPUs visible, torch {torch.__version__}"
    )
    print(
        "# times in ms, median over the measured iterations [min, max]; total = non-stragglers' "
        "call -> completion; post = straggler's call -> completion (max over non-stragglers)"
    )
    print(f"# {AUTO_METHOD}")
    print(
        f"# iterations: {cfg.warmup} warm-up (first one verified) + {cfg.iters} measured per "
        f"(size, delay, algo), algorithms interleaved; synchronised start margin "
        f"{cfg.start_margin_s * 1e3:g} ms"
    )
    if model:
        print(
            f"# model: alpha-beta fitted to the stragg-ring rows: alpha = "
            f"{model['alpha_s'] * 1e6:.1f} us/round, 1/beta = "
            f"{(1e-9 / model['beta_s_per_byte']) if model['beta_s_per_byte'] > 0 else math.inf:.2f}"
            f" GB/s; model post = simulate(..., straggler_delay=arrival).time - arrival"
        )
    window = _dynamic_window_s()
    dyn = [r for r in rows if r["algo"] == DYNAMIC]
    if dyn:
        how = (
            f"{window * 1e3:g} ms (STRAGG_DYNAMIC_WINDOW_US)"
            if window is not None
            else "from the cost model per call (break-even: StragglAR's critical delay, or "
            "50 us once the recent straggler delays exceed it)"
        )
        print(
            f"# {DYNAMIC}: STRAGG_STRAGGLER=dynamic, agreement window {how}: the early ranks "
            "wait that long for the last one, then run StragglAR without it; all in the window: "
            "plain Ring. 'agreed R:k' = straggler R agreed in k iterations"
        )
        print(
            f"# {DYNAMIC}: arrival protocol cost (agreement time on the rank that arrives last, "
            "median [min, max]) and window used, per size/delay:"
        )
        for r in dyn:
            print(
                f"#   {r['bytes'] / 2**20:6.3g} MiB D {r['delay_s'] * 1e3:8.3f} ms: protocol "
                f"{r['protocol_s'] * 1e6:7.1f} us [{r['protocol_min_s'] * 1e6:.1f}, "
                f"{r['protocol_max_s'] * 1e6:.1f}], window {r['dynamic_window_s'] * 1e3:.3f} ms"
            )
    reps = sum(r.get("late_repeats", 0) for r in rows)
    print(
        f"# late starts: {reps} measured iterations repeated because a rank started more than "
        f"{cfg.late_limit_s * 1e3:g} ms after the agreed instant (of "
        f"{sum(r['iters'] for r in rows)} kept)"
    )
    for note in notes:
        print(f"# NOTE {note}")
    print(
        f"#{'size':>9} {'D':>9} {'arrival':>9} {'algo':<25} {'total':>9} {'[min':>9} {'max]':>9}"
        f" {'post':>9} {'[min':>9} {'max]':>9} {'model':>9} {'meas/':>6} {'post speedup':>13}"
        f" {'total':>6}"
    )
    print(
        f"#{'(MiB)':>9} {'(ms)':>9} {'(ms)':>9} {'':<25} {'':>9} {'':>9} {'':>9} {'':>9} {'':>9}"
        f" {'':>9} {'post':>9} {'model':>6} {'vs ring meas':>13} {'vs':>6}"
    )
    print(
        f"#{'':>9} {'':>9} {'':>9} {'':<25} {'':>9} {'':>9} {'':>9} {'':>9} {'':>9}"
        f" {'':>9} {'':>9} {'':>6} {'(model)':>13} {'gloo':>6}"
    )
    prev = None
    for r in rows:
        key = (r["bytes"], r["delay_s"])
        if prev is not None and key != prev:
            print()
        prev = key
        mp_ = r.get("model_post_arrival_s")
        ratio = r["post_arrival_s"] / mp_ if mp_ else None
        sp, msp = r.get("post_speedup_vs_ring"), r.get("model_post_speedup_vs_ring")
        spd = f"{_x(sp, 5)} ({_x(msp, 4)})" if msp else f"{_x(sp, 5)}       "
        print(
            f" {r['bytes'] / 2**20:9.3g} {_ms(r['delay_s'])} {_ms(r['arrival_s'])} {r['algo']:<25}"
            f" {_ms(r['total_s'])} {_ms(r['total_min_s'])} {_ms(r['total_max_s'])}"
            f" {_ms(r['post_arrival_s'])} {_ms(r['post_arrival_min_s'])}"
            f" {_ms(r['post_arrival_max_s'])} {_ms(mp_)} {_x(ratio)} {spd:>13}"
            f" {_x(r.get('total_speedup_vs_gloo'))}{_agreed(r)}"
        )
    print()
    for line in check_targets(rows):
        print(line)
    sys.stdout.flush()


def check_targets(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's targets, one line each (PASS / FAIL / n/a)."""
    out = ["# targets (stragglar rows; D >= reduce-scatter means delay_s >= the measured auto):"]
    sg = [r for r in rows if r["algo"] in (STRAGGLAR, DYNAMIC)]
    hidden = [r for r in sg if r["delay_s"] >= r["reduce_scatter_s"] * 0.999]
    out.append(
        f"#  1. post-arrival speedup over stragg-ring within {TOLERANCE:.0%} of the model's "
        f"(D >= reduce-scatter):"
    )
    for r in hidden:
        sp, msp = r.get("post_speedup_vs_ring"), r.get("model_post_speedup_vs_ring")
        if sp is None or msp is None:
            out.append(f"#     {r['algo']:<25} {r['bytes'] >> 20:4d} MiB: n/a")
            continue
        dev = sp / msp - 1.0
        verdict = "PASS" if abs(dev) <= TOLERANCE else ("FAIL" if dev < 0 else "ABOVE model")
        out.append(
            f"#     {r['algo']:<25} {r['bytes'] / 2**20:6.3g} MiB  D {r['delay_s'] * 1e3:8.3f} ms:"
            f" measured {sp:.3f}x, model {msp:.3f}x ({dev:+.1%}) {verdict}"
        )
    if not hidden:
        out.append("#     n/a (no delay >= the reduce-scatter time; add --delays auto)")
    out.append(
        f"#  2. end to end vs gloo >= {GLOO_TARGET}x at {GLOO_TARGET_BYTES >> 20} MiB, "
        f"D >= reduce-scatter:"
    )
    g = [r for r in hidden if r["bytes"] == GLOO_TARGET_BYTES]
    for r in g:
        x = r.get("total_speedup_vs_gloo")
        verdict = "n/a" if x is None else ("PASS" if x >= GLOO_TARGET else "FAIL")
        out.append(
            f"#     {r['algo']:<25} D {r['delay_s'] * 1e3:8.3f} ms: total {r['total_s'] * 1e3:.3f}"
            f" ms vs gloo {r['total_s'] * (x or 0) * 1e3:.3f} ms = {_x(x, 4).strip()}x {verdict}"
        )
    if not g:
        out.append(f"#     n/a (needs size {GLOO_TARGET_BYTES >> 20}MiB and a delay >= auto)")
    out.append(
        "#  3. D = 0: stragglar no worse than the model's worst case, i.e. its slowdown vs "
        f"stragg-ring (post-arrival) <= the model's x (1+{TOLERANCE:.0%}) (for {STRAGGLAR} D = 0 "
        f"is the model's worst case; {DYNAMIC} runs plain Ring when all arrive within its window);"
        " absolute total vs model total for reference:"
    )
    zero = [r for r in sg if r["delay_s"] == 0.0]
    for r in zero:
        sp, msp = r.get("post_speedup_vs_ring"), r.get("model_post_speedup_vs_ring")
        mt = r.get("model_total_s")
        if sp is None or msp is None or not mt:
            out.append(f"#     {r['algo']:<25} {r['bytes'] >> 20:4d} MiB: n/a")
            continue
        slow, mslow = 1.0 / sp, 1.0 / msp
        verdict = "PASS" if slow <= mslow * (1.0 + TOLERANCE) else "FAIL"
        out.append(
            f"#     {r['algo']:<25} {r['bytes'] / 2**20:6.3g} MiB: slowdown vs ring measured "
            f"{slow:.3f}x, model {mslow:.3f}x; total {r['total_s'] * 1e3:.3f} ms vs model "
            f"{mt * 1e3:.3f} ms ({r['total_s'] / mt:.2f}) {verdict}"
        )
    if not zero:
        out.append("#     n/a (no delay 0 in --delays)")
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--ranks", type=int, default=4, help="number of ranks to spawn (default 4)")
    p.add_argument(
        "--sizes",
        type=parse_sizes,
        default=parse_sizes(DEFAULT_SIZES),
        help=f"comma list of buffer sizes, e.g. 1MiB,64MiB,256MiB (default {DEFAULT_SIZES})",
    )
    p.add_argument(
        "--delays",
        default=DEFAULT_DELAYS,
        help="comma list of straggler delays: seconds (0.01), 5ms, 250us, auto (= measured ring "
        f"reduce-scatter time), auto*2 (default {DEFAULT_DELAYS})",
    )
    p.add_argument("--straggler", type=int, default=None, help="straggler rank (default n-1)")
    p.add_argument(
        "--algos",
        default=",".join(ALL_ALGOS),
        help=f"comma list from {','.join(ALL_ALGOS)} (default all; {RING} always runs: it "
        "calibrates 'auto' and the model)",
    )
    p.add_argument("--iters", type=int, default=20, help="measured iterations (default 20)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up iterations, first verified")
    p.add_argument(
        "--calib-iters",
        type=int,
        default=10,
        help="stragg-ring iterations per size measuring the 'auto' delay (default 10)",
    )
    p.add_argument(
        "--start-margin",
        type=float,
        default=8e-3,
        help="seconds between the start agreement and the common start instant (default 0.008)",
    )
    p.add_argument(
        "--late-limit",
        type=float,
        default=1e-3,
        help="repeat a measured iteration when a rank started more than this many seconds after "
        "the agreed instant (the straggler: after instant + D); at most --iters repeats per "
        "(size, delay, algo); default 0.001, inf = never",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="collective timeout, seconds")
    p.add_argument("--json", action="store_true", help="print one JSON list of rows, nothing else")
    args = p.parse_args(argv)
    if args.ranks < 3:
        p.error("--ranks must be >= 3 (StragglAR needs at least 2 non-stragglers)")
    if args.straggler is None:
        args.straggler = args.ranks - 1
    if not 0 <= args.straggler < args.ranks:
        p.error(f"--straggler must be a rank in 0..{args.ranks - 1}")
    if args.iters < 1 or args.warmup < 1 or args.calib_iters < 1:
        p.error("--iters, --warmup and --calib-iters must be >= 1 (warm-up 1 is the verified one)")
    for s in args.sizes:
        if s <= 0 or s % ELEM:
            p.error(f"size {s} B is not a positive multiple of {ELEM} (float32)")
    try:
        args.delays = parse_delays(args.delays)
    except ValueError as e:
        p.error(str(e))
    if not args.delays:
        p.error("--delays is empty")
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    unknown = sorted(set(algos) - set(ALL_ALGOS))
    if unknown or not algos:
        p.error(f"--algos: unknown {unknown}; choose from {','.join(ALL_ALGOS)}")
    if RING not in algos:
        algos.append(RING)
    args.algos = [a for a in ALL_ALGOS if a in algos]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    mod, why = import_stragg()
    if mod is None:
        eprint(f"straggler.py: stragg unavailable: {why}")
        return 2
    cfg = Config(
        ranks=args.ranks,
        sizes=args.sizes,
        delays=args.delays,
        algos=args.algos,
        straggler=args.straggler,
        iters=args.iters,
        warmup=args.warmup,
        calib_iters=args.calib_iters,
        start_margin_s=args.start_margin,
        late_limit_s=args.late_limit,
        timeout_s=args.timeout,
        json=args.json,
    )
    if args.iters < 5:
        eprint("straggler.py: note: fewer than 5 measured iterations; medians will be noisy")
    if (os.cpu_count() or 1) < cfg.ranks:
        eprint(
            f"straggler.py: note: {cfg.ranks} ranks on {os.cpu_count()} CPUs: oversubscribed, "
            "expect noise (the straggler sleeps, freeing a CPU while it is late)"
        )
    t_run = time.monotonic()
    doc = spawn_and_collect(worker, cfg, cfg.ranks, "straggler.py")
    if doc is None:
        return 1
    rows, notes = doc["rows"], doc["notes"]
    model = fit_ring_model(rows, cfg.ranks)
    apply_model(rows, cfg.ranks, cfg.straggler, model)
    add_ratios(rows)
    eprint(f"straggler.py: measured in {time.monotonic() - t_run:.1f} s")
    if args.json:
        for note in notes:
            eprint(f"# NOTE {note}")
        for line in check_targets(rows):
            eprint(line)
        print(json.dumps(rows))
    else:
        print_table(cfg, rows, model, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
