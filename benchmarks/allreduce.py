"""all_reduce benchmark: stragg vs Gloo vs OpenMPI, and the memory-traffic limit of stragg's plan.

    python benchmarks/allreduce.py --ranks 4
    python benchmarks/allreduce.py --ranks 4 --sizes 4KiB,64KiB,1MiB,16MiB,64MiB --reps 5
    python benchmarks/allreduce.py --ranks 4 --json > allreduce.json
    python benchmarks/allreduce.py --ranks 4 --plot allreduce.png

Systems: `dist.all_reduce` on stragg and on Gloo (spawned ranks: every rank initialises the
default group with Gloo for control and a group of the backend under test with
`dist.new_group(backend=...)`), and OpenMPI's MPI_Allreduce through mpi4py on numpy buffers,
launched with `mpirun --allow-run-as-root --oversubscribe -np P` on benchmarks/_mpi_worker.py.
The MPI column is skipped, with a one-line message, when mpirun or mpi4py is absent
(scripts/setup.sh installs both).

Timing, identical for every system (the OSU osu_allreduce method, _mpi_worker.osu_repetition):
per size, one verified call, a warm-up repetition of `--warmup` calls (it also absorbs one-time
costs such as stragg's first link probe, after its 16th call), one of `--warmup`/5 calls that
estimates the rate, then repetitions of [barrier, `calls` back-to-back all_reduces (float32,
SUM), mean per call]; a repetition's value is the slowest rank's mean (barrier and max-reduction
on the system measured, as osu_allreduce does with MPI). `calls` is about
`--budget` seconds at the estimated rate, within [--min-iters, --iters] (`--budget 0`: always
--iters). The run makes `--reps` repetitions in `--rounds` launches of each system (default: one
repetition per launch); every launch runs one system in its own processes (so one system's
activity does not spill into another's timing), and the systems take turns, their order rotating
from round to round, so the machine's noise hits all alike. Reported: median over repetitions,
min/max (IQR in --json).
algbw = bytes / time / 1e9, busbw = algbw * 2(n-1)/n (nccl-tests convention).

Limit: the memory traffic of the schedule stragg ran for the size (stragg.recent_calls), at the
copy bandwidth measured in the same launch (all ranks copying 64 MiB at once, slowest rank; a
copy of b bytes reads b and writes b). Over shared memory every message goes through small
staging slots that stay in the caches, so what reaches memory is the user buffers' traffic: a
send reads b bytes (half a copy), a copying receive writes b (half a copy), a reducing receive
reads and writes b (one copy). The limit is the busiest rank's copy-equivalent bytes / copy
bandwidth: an implementation that moves the data this way beats it only where the buffers
themselves fit in the caches (latency terms are not modelled, so small sizes sit far above it).
The one-shot all_reduce of small calls (plan "oneshot") is counted alike: its copy in and, on
every rank but 0, the copy of rank 0's input out, one copy each; each of the n - 1 reductions
one copy.

Floor (stragg rows up to 1 MiB): the same repetitions of `dist.all_reduce` on torch's `fake`
backend (a process group that moves no data), every rank at once: what torch's own dispatch of
the call costs on this machine with this many ranks sharing its cores, a time no backend reached
through `dist.all_reduce` can beat. Measured in the stragg launch, after stragg's repetitions.

MPI + dispatch (same sizes, in the MPI launch after its repetitions): every call is that `fake`
`dist.all_reduce` followed by OpenMPI's Allreduce, the same number of calls per repetition.
torch's CPU wheel has no MPI backend; this is what OpenMPI would cost reached through
`dist.all_reduce`, the comparison that holds torch's per-call cost constant. At small sizes,
where torch's dispatch is a large part of the time and the ranks share few cores, it is not
the sum of the two (the dispatch between calls also changes how the ranks meet).

The first call of every (size, system) and the call after the last repetition are checked
exactly against the expected sum (integer-valued float32 data, so any summation order is exact);
a mismatch aborts the run instead of reporting a broken all_reduce as fast. (Back-to-back calls
in place let the values grow, to inf for long runs: that does not change the work done.)
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

# Python puts this script's directory first on sys.path (also in the spawned ranks): the
# siblings _common.py and _mpi_worker.py are found from any working directory; stragg itself is
# the installed one.
from _common import (
    ELEM,
    Stats,
    bus_factor,
    default_sizes,
    eprint,
    fit_ring_alpha_beta,
    import_stragg,
    make_data,
    mismatch_detail,
    parse_sizes,
    spawn_and_collect,
    stragg_stats,
)
from _mpi_worker import calls_for, osu_repetition

HERE = Path(__file__).resolve().parent
SYSTEMS = ("stragg", "gloo", "mpi")
COPY_BW_BYTES = 64 << 20


@dataclass
class Config:
    ranks: int
    sizes: list[int]
    backends: list[str]  # torch backends of this launch (stragg, gloo)
    iters: int
    warmup: int
    min_iters: int
    budget_s: float
    reps: int  # repetitions per launch
    timeout_s: float
    json: bool
    stragg_note: str = ""


class VerificationError(RuntimeError):
    pass


def _stats_check(before: dict[str, Any], after: dict[str, Any], issued: int) -> str:
    """One line from stragg.backend_stats deltas; warns if all_reduce did not run on stragg."""
    if not after or "error" in after:
        return f"stragg backend_stats: {after.get('error', 'unavailable')}" if after else ""

    def delta(key: str) -> int | None:
        a, b = before.get(key), after.get(key)
        return b - a if isinstance(a, int) and isinstance(b, int) else None

    transport = after.get("transport")
    msg = f"stragg backend_stats after the run: transport {transport!r}"
    calls, delegated = delta("allreduce_calls"), delta("delegated_calls")
    barriers = delta("barrier_calls")
    if calls is not None:
        msg += f", allreduce_calls +{calls} for {issued} all_reduces issued"
    if barriers is not None:
        msg += f", barrier_calls +{barriers}"
    if delegated is not None:
        msg += f", delegated_calls +{delegated}"
    if transport == "gloo" or (calls is not None and calls < issued):
        msg += "  WARNING: stragg all_reduce was (partly) delegated to Gloo"
    return msg


# --------------------------------------------------------------------------------------------
# One launch of the torch backends (spawned ranks)


def _max_over(group: Any, x: float) -> float:
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t[0])


def _copy_bandwidth(ctrl: Any) -> float:
    """Bytes per second one rank copies while every rank copies (best of 3 repetitions)."""
    src = torch.ones(COPY_BW_BYTES // ELEM, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = [
        osu_repetition(lambda: dst.copy_(src), lambda: dist.barrier(group=ctrl),
                       lambda x: _max_over(ctrl, x), 4)
        for _ in range(3)
    ]  # fmt: skip
    return COPY_BW_BYTES / min(times)


def _verify(
    b: str, buf: torch.Tensor, expected: torch.Tensor, rank: int, n: int, ctrl: Any
) -> None:
    """Raises VerificationError on every rank if any rank's result differs from `expected`."""
    local_bad = not torch.equal(buf, expected)
    flags = torch.zeros(n, dtype=torch.float64)
    flags[rank] = float(local_bad)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=ctrl)
    bad_ranks = [r for r in range(n) if flags[r] > 0]
    if bad_ranks:
        detail = mismatch_detail(buf, expected) if local_bad else ""
        details: list[Any] = [None] * n
        dist.all_gather_object(details, detail, group=ctrl)
        per_rank = "; ".join(f"rank {r}: {details[r]}" for r in bad_ranks)
        raise VerificationError(
            f"{b} all_reduce(SUM, float32, {buf.numel() * ELEM} bytes, {n} ranks) "
            f"returned wrong results on ranks {bad_ranks} ({per_rank})"
        )


def _last_plan(stragg_mod: Any, group: Any, nbytes: int) -> str:
    """The plan of the group's last all_reduce of `nbytes` (not simply the last call: the
    one-element max-reductions that end each repetition are all_reduces on the group too)."""
    try:
        calls = stragg_mod.recent_calls(group)
    except (RuntimeError, AttributeError) as e:
        return f"unknown ({e})"
    mine = [c for c in calls if c["bytes"] == nbytes]
    return str(mine[-1]["plan"]) if mine else "unknown"


FLOOR_MAX_BYTES = 1 << 20  # the dispatch floor matters (and is measured) up to this size
FLOOR_MIN_CALLS = 1000  # calls per floor repetition (after a stragg barrier: ranks start together)


def _floor_group() -> Any:
    """A group on torch's `fake` backend (no communication): the dispatch floor."""
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake")

    return dist.new_group(backend="fake")


def _time_size(
    nbytes: int, rank: int, cfg: Config, groups: dict[str, Any], ctrl: Any, issued: dict[str, int]
) -> dict[str, Any]:
    """Verified warm-up, then cfg.reps repetitions per backend of one size."""
    n = cfg.ranks
    src, expected, buf = make_data(nbytes, rank, n)

    def call(b: str) -> None:
        dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=groups[b])
        issued[b] += 1

    def max_over(b: str, x: float) -> float:
        # On the system itself, like its barrier (as osu_allreduce does with MPI): another
        # backend's activity between repetitions would spill into the next one's timing.
        issued[b] += 1
        return _max_over(groups[b], x)

    def repetition(b: str, calls: int) -> float:
        return osu_repetition(
            lambda: call(b),
            lambda: dist.barrier(group=groups[b]),
            lambda x: max_over(b, x),
            calls,
        )

    calls: dict[str, int] = {}
    for b in cfg.backends:
        buf.copy_(src)
        call(b)
        _verify(b, buf, expected, rank, n, ctrl)
        repetition(b, max(1, cfg.warmup))
        est = repetition(b, max(1, cfg.warmup // 5))
        calls[b] = calls_for(cfg.budget_s, est, cfg.iters, cfg.min_iters)
    samples: dict[str, list[float]] = {b: [] for b in cfg.backends}
    for _ in range(cfg.reps):
        for b in cfg.backends:
            buf.copy_(src)
            samples[b].append(repetition(b, calls[b]))
    per_size: dict[str, Any] = {}
    for b in cfg.backends:
        buf.copy_(src)
        call(b)
        _verify(b, buf, expected, rank, n, ctrl)
        per_size[b] = {"samples": samples[b], "calls": calls[b]}
    if "floor" in groups and nbytes <= FLOOR_MAX_BYTES:
        floor_calls = max(calls.get("stragg", 0), FLOOR_MIN_CALLS)
        per_size["stragg"]["floor_samples"] = [
            osu_repetition(lambda: dist.all_reduce(buf, group=groups["floor"]),
                           lambda: dist.barrier(group=groups["stragg"]),
                           lambda x: max_over("stragg", x), floor_calls)
            for _ in range(cfg.reps)
        ]  # fmt: skip
    return per_size


def worker(rank: int, cfg: Config, result_path: str) -> None:
    if cfg.json:
        os.dup2(2, 1)  # keep the parent's stdout for the JSON document only
        sys.stdout = sys.stderr
    torch.set_num_threads(1)  # ranks share the cores; no intra-op oversubscription
    n = cfg.ranks
    stragg_mod = None
    if "stragg" in cfg.backends:
        stragg_mod, why = import_stragg()
        if stragg_mod is None:
            raise RuntimeError(f"rank {rank}: import stragg failed: {why}")

    timeout = datetime.timedelta(seconds=cfg.timeout_s)
    dist.init_process_group("gloo", rank=rank, world_size=n, timeout=timeout)
    ctrl = dist.group.WORLD
    groups = {b: dist.new_group(backend=b, timeout=timeout) for b in cfg.backends}
    if "stragg" in groups:
        groups["floor"] = _floor_group()
    out: dict[str, Any] = {"copy_bw_Bps": _copy_bandwidth(ctrl), "sizes": {}}
    stats0: dict[str, Any] = {}
    if "stragg" in groups:
        stats0 = stragg_stats(stragg_mod, groups["stragg"])
        out["stragg_backend_stats"] = stats0
    issued = {b: 0 for b in cfg.backends}

    for nbytes in cfg.sizes:
        per_size = _time_size(nbytes, rank, cfg, groups, ctrl, issued)
        if "stragg" in groups:
            per_size["stragg"]["plan"] = _last_plan(stragg_mod, groups["stragg"], nbytes)
        out["sizes"][str(nbytes)] = per_size

    if "stragg" in groups:
        stats1 = stragg_stats(stragg_mod, groups["stragg"])
        out["transport"] = stats1.get("transport")
        out["stats_check"] = _stats_check(stats0, stats1, issued["stragg"])
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump(out, f)
    dist.barrier(group=ctrl)
    for b, g in groups.items():
        if b != "floor":  # the fake backend has nothing to shut down
            dist.destroy_process_group(g)
    dist.destroy_process_group()


# --------------------------------------------------------------------------------------------
# OpenMPI launches


def mpi_unavailable() -> str:
    """Why the OpenMPI column cannot run here ("" if it can)."""
    hint = "(Debian: apt-get install openmpi-bin libopenmpi-dev; pip install mpi4py)"
    if shutil.which("mpirun") is None:
        return f"mpirun not found {hint}"
    probe = subprocess.run([sys.executable, "-c", "import mpi4py"], capture_output=True, text=True,
                           check=False)  # fmt: skip
    if probe.returncode != 0:
        return f"mpi4py cannot be imported {hint}"
    return ""


def run_mpi(cfg: Config) -> dict[str, Any] | None:
    """One mpirun launch of _mpi_worker.py; its result, or None (said why on stderr)."""
    with tempfile.TemporaryDirectory(prefix="stragg-allreduce-mpi-") as tmp:
        cfg_path, out_path = os.path.join(tmp, "cfg.json"), os.path.join(tmp, "out.json")
        with open(cfg_path, "w") as f:
            json.dump({"sizes": cfg.sizes, "warmup": cfg.warmup, "reps": cfg.reps,
                       "budget_s": cfg.budget_s, "max_calls": cfg.iters,
                       "min_calls": cfg.min_iters, "dispatch_max_bytes": FLOOR_MAX_BYTES},
                      f)  # fmt: skip
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(cfg.ranks),
               sys.executable, str(HERE / "_mpi_worker.py"), cfg_path, out_path]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=cfg.timeout_s * 4,
                              check=False)  # fmt: skip
        if proc.returncode != 0 or not os.path.exists(out_path):
            eprint(f"allreduce.py: mpirun failed (rc {proc.returncode}):\n"
                   f"{(proc.stdout + proc.stderr)[-3000:]}")  # fmt: skip
            return None
        with open(out_path) as f:
            return json.load(f)


# --------------------------------------------------------------------------------------------
# The memory-traffic limit


def traffic_bytes(plan: str, n: int, nbytes: int) -> float | None:
    """Copy-equivalent bytes the busiest rank moves under `plan` (see the module docstring);
    None for plans whose schedule is not rebuilt here (straggler-parameterised ones)."""
    if "(" in plan or plan in ("local", "gloo", "unknown"):
        return None
    if plan == "oneshot":
        # Not a schedule: every rank copies its input in (1), every rank but 0 copies rank 0's
        # input out (1), then reduces the n - 1 others into it (1 each).
        return float((n + 1) * nbytes) if n > 1 else 0.0
    import stragg.schedule

    try:
        sched = stragg.schedule.build(plan, n)
    except (ValueError, RuntimeError):
        return None
    chunk_bytes = [length * ELEM for _, length in sched.chunk_ranges(nbytes // ELEM)]

    def run_bytes(chunk: int, count: int) -> int:
        return sum(chunk_bytes[chunk : chunk + count])

    busiest = 0.0
    for r in range(n):
        total = 0.0
        for step in sched.rank_program(r):
            if step.get("send"):
                _, chunk, count = step["send"]
                total += 0.5 * run_bytes(chunk, count)
            if step.get("recv"):
                _, chunk, count, op = step["recv"]
                total += run_bytes(chunk, count) * (0.5 if op == "copy" else 1.0)
        busiest = max(busiest, total)
    return busiest


# --------------------------------------------------------------------------------------------
# Driver: launches, aggregation, table, plot


def _row(system: str, nbytes: int, samples: list[float], calls: int, n: int) -> dict[str, Any]:
    st = Stats.of(samples)
    algbw = nbytes / st.median / 1e9
    return {
        "backend": system,
        "bytes": nbytes,
        "time_s": st.median,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * bus_factor(n),
        "time_min_s": st.minimum,
        "time_max_s": st.maximum,
        "time_p25_s": st.p25,
        "time_p75_s": st.p75,
        "reps": st.count,
        "iters": calls,  # back-to-back calls per repetition (the last launch's)
        "ranks": n,
        "dtype": "float32",
        "op": "sum",
    }


def collect(args: argparse.Namespace, cfg: Config, systems: list[str]) -> tuple[list, dict] | None:
    """Runs the launches; returns (rows, info)."""
    samples: dict[tuple[str, int], list[float]] = {}
    calls: dict[tuple[str, int], int] = {}
    plans: dict[int, str] = {}
    floors: dict[int, list[float]] = {}
    dispatched: dict[int, list[float]] = {}  # MPI + torch's dispatch, by size
    copy_bw: list[float] = []
    info: dict[str, Any] = {}
    reps_left = args.reps
    for launch in range(args.rounds):
        reps = math.ceil(reps_left / (args.rounds - launch))
        reps_left -= reps
        # One launch per system, in its own processes: one system's activity does not spill
        # into another's timing (24 Gloo calls before each stragg repetition in the same
        # processes made stragg's 4-rank 4 KiB median 67 us instead of 40; a 0.1 s sleep: 45).
        jobs = list(cfg.backends) + (["mpi"] if "mpi" in systems else [])
        shift = launch % len(jobs)
        for job in jobs[shift:] + jobs[:shift]:
            lcfg = replace(cfg, reps=reps, backends=[] if job == "mpi" else [job])
            if job == "mpi":
                res = run_mpi(lcfg)
                if res is None:
                    return None
                info["mpi"] = res["library"]
                per = {k: {"mpi": v} for k, v in res["sizes"].items()}
            else:
                res = spawn_and_collect(worker, lcfg, cfg.ranks, "allreduce.py")
                if res is None:
                    return None
                if job == "stragg" or "stragg" not in cfg.backends:
                    copy_bw.append(res["copy_bw_Bps"])
                for k in ("transport", "stats_check", "stragg_backend_stats"):
                    if k in res:
                        info.setdefault(k, res[k])
                per = res["sizes"]
            for size, by_system in per.items():
                for system, v in by_system.items():
                    samples.setdefault((system, int(size)), []).extend(v["samples"])
                    calls[(system, int(size))] = v["calls"]
                    if "plan" in v:
                        plans[int(size)] = v["plan"]
                    if "floor_samples" in v:
                        floors.setdefault(int(size), []).extend(v["floor_samples"])
                    if "dispatch_samples" in v:
                        dispatched.setdefault(int(size), []).extend(v["dispatch_samples"])
        if not args.json:
            eprint(f"# launch {launch + 1}/{args.rounds} done")
    bw = sorted(copy_bw)[len(copy_bw) // 2] if copy_bw else 0.0
    info["copy_bw_gbps"] = bw / 1e9
    rows = []
    for system in systems:
        for nbytes in cfg.sizes:
            key = (system, nbytes)
            if key not in samples:
                continue
            row = _row(system, nbytes, samples[key], calls[key], cfg.ranks)
            if system == "stragg":
                row["transport"] = info.get("transport")
                row["plan"] = plans.get(nbytes, "unknown")
                traffic = traffic_bytes(row["plan"], cfg.ranks, nbytes)
                if traffic is not None and bw > 0:
                    row["limit_s"] = traffic / bw
                    row["limit_busbw_gbps"] = nbytes / row["limit_s"] / 1e9 * bus_factor(cfg.ranks)
                if nbytes in floors:
                    fl = Stats.of(floors[nbytes])
                    row["floor_s"], row["floor_min_s"], row["floor_max_s"] = (
                        fl.median, fl.minimum, fl.maximum)  # fmt: skip
            if system == "mpi" and nbytes in dispatched:
                ds = Stats.of(dispatched[nbytes])
                row["dispatch_s"], row["dispatch_min_s"], row["dispatch_max_s"] = (
                    ds.median, ds.minimum, ds.maximum)  # fmt: skip
            rows.append(row)
    return rows, info


def print_table(rows: list[dict[str, Any]], systems: list[str], cfg: Config,
                args: argparse.Namespace, info: dict[str, Any]) -> None:  # fmt: skip
    n = cfg.ranks
    print(f"# stragg all_reduce benchmark: {n} ranks, float32, sum, {os.cpu_count()} CPUs visible, "
          f"torch {torch.__version__}")  # fmt: skip
    print(
        f"# time = median over {args.reps} repetitions ({args.rounds} launches per system, one "
        f"system per launch, in turns) of the slowest rank's mean per call over back-to-back "
        f"calls after a barrier (OSU method); min/max over the repetitions; "
        f"busbw = algbw * {bus_factor(n):.3f}"
    )
    if "mpi" in info:
        print(f"# mpi: {info['mpi']} (mpi4py, numpy buffers, mpirun --oversubscribe)")
    print(
        f"# copy bandwidth per rank, all {n} ranks copying: {info['copy_bw_gbps']:.2f} GB/s; "
        f"limit = the busiest rank's copy-equivalent bytes of stragg's schedule / that bandwidth"
    )
    if cfg.stragg_note:
        print(f"# stragg unavailable ({cfg.stragg_note})")
    by = {(r["backend"], r["bytes"]): r for r in rows}
    head = f"{'size':>9} {'plan':>7}"
    for s in systems:
        head += f" | {s + ' us':>10} {'min':>8} {'max':>8} {'busbw':>6}"
    head += f" | {'limit us':>9} {'busbw':>6}"
    floors = any("floor_s" in r for r in rows)
    if floors:
        head += f" | {'floor us':>8}"
    dispatched = any("dispatch_s" in r for r in rows)
    if dispatched:
        head += f" | {'mpi+disp us':>11}"
    peers = [s for s in systems if s != "stragg"] if "stragg" in systems else []
    ratios = peers + (["mpi+disp"] if dispatched and "stragg" in systems else [])
    for p in ratios + (["limit"] if "stragg" in systems else []):
        head += f" | {'stragg/' + p:>15}"
    print(head)
    for nbytes in cfg.sizes:
        st = by.get(("stragg", nbytes))
        line = f"{_fmt_size(nbytes):>9} {(st or {}).get('plan', '-')[:7]:>7}"
        for s in systems:
            r = by.get((s, nbytes))
            if r is None:
                line += f" | {'-':>10} {'-':>8} {'-':>8} {'-':>6}"
                continue
            line += (f" | {r['time_s'] * 1e6:10.1f} {r['time_min_s'] * 1e6:8.1f} "
                     f"{r['time_max_s'] * 1e6:8.1f} {r['busbw_gbps']:6.2f}")  # fmt: skip
        lim = (st or {}).get("limit_s")
        line += (
            f" | {lim * 1e6:9.1f} {st['limit_busbw_gbps']:6.2f}" if lim else f" | {'-':>9} {'-':>6}"
        )
        if floors:
            fl = (st or {}).get("floor_s")
            line += f" | {fl * 1e6:8.1f}" if fl else f" | {'-':>8}"
        disp = by.get(("mpi", nbytes), {}).get("dispatch_s")
        if dispatched:
            line += f" | {disp * 1e6:11.1f}" if disp else f" | {'-':>11}"
        for p in ratios:
            ref = disp if p == "mpi+disp" else by.get((p, nbytes), {}).get("time_s")
            line += f" | {st['time_s'] / ref:14.2f}x" if st and ref else f" | {'-':>15}"
        if "stragg" in systems:
            line += f" | {st['time_s'] / lim:14.2f}x" if st and lim else f" | {'-':>15}"
        print(line)
    print(
        "# stragg/peer: time ratio (< 1: stragg faster); stragg/limit: how far above the "
        "memory-traffic limit"
    )
    if floors:
        print(
            f"# floor: dist.all_reduce on torch's 'fake' backend (no data moved), all {n} ranks "
            "at once: torch's own dispatch per call, below which no torch backend can go"
        )
    if dispatched:
        print(
            "# mpi+disp: every call is that 'fake' dist.all_reduce followed by OpenMPI's "
            "Allreduce: OpenMPI reached through torch's dispatch (the CPU wheel has no MPI backend)"
        )
    if info.get("stats_check"):
        print("# " + info["stats_check"])
    sys.stdout.flush()


def _fmt_size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def plot(rows: list[dict[str, Any]], systems: list[str], n: int, path: str) -> None:
    """Time and busbw vs size, one line per system (and the limit), min/max as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for s in systems:
        rs = sorted((r for r in rows if r["backend"] == s), key=lambda r: r["bytes"])
        if not rs:
            continue
        x = [r["bytes"] for r in rs]
        t = [r["time_s"] * 1e6 for r in rs]
        err = [[(r["time_s"] - r["time_min_s"]) * 1e6 for r in rs],
               [(r["time_max_s"] - r["time_s"]) * 1e6 for r in rs]]  # fmt: skip
        label = {"mpi": "OpenMPI", "gloo": "Gloo"}.get(s, s)
        ax_t.errorbar(x, t, yerr=err, marker="o", capsize=3, label=label)
        ax_b.plot(x, [r["busbw_gbps"] for r in rs], marker="o", label=label)
    lim = sorted((r for r in rows if r["backend"] == "stragg" and r.get("limit_s")),
                 key=lambda r: r["bytes"])  # fmt: skip
    if lim:
        x = [r["bytes"] for r in lim]
        ax_t.plot(x, [r["limit_s"] * 1e6 for r in lim], "k--", label="memory-traffic limit")
        ax_b.plot(x, [r["limit_busbw_gbps"] for r in lim], "k--", label="memory-traffic limit")
    fl = sorted((r for r in rows if r["backend"] == "stragg" and r.get("floor_s")),
                key=lambda r: r["bytes"])  # fmt: skip
    if fl:
        ax_t.plot([r["bytes"] for r in fl], [r["floor_s"] * 1e6 for r in fl], "k:",
                  label="torch dispatch floor")  # fmt: skip
    md = sorted((r for r in rows if r["backend"] == "mpi" and r.get("dispatch_s")),
                key=lambda r: r["bytes"])  # fmt: skip
    if md:
        ax_t.plot([r["bytes"] for r in md], [r["dispatch_s"] * 1e6 for r in md], "-.",
                  marker="x", label="OpenMPI + torch dispatch")  # fmt: skip
    for ax in (ax_t, ax_b):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time per all_reduce (us), median, min/max")
    ax_b.set_ylabel("bus bandwidth (GB/s)")
    fig.suptitle(f"all_reduce, {n} ranks, float32 SUM, one host")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--ranks", type=int, default=4, help="number of ranks to spawn (default 4)")
    p.add_argument(
        "--sizes",
        type=parse_sizes,
        default=None,
        help="comma list, e.g. 4KiB,1MiB,64MiB (default: 4KiB..256MiB, powers of 4)",
    )
    p.add_argument("--iters", type=int, default=200,
                   help="max back-to-back calls per repetition (default 200)")  # fmt: skip
    p.add_argument("--warmup", type=int, default=50,
                   help="calls of the warm-up repetition (default 50; OSU's is 200)")  # fmt: skip
    p.add_argument("--min-iters", type=int, default=2,
                   help="min back-to-back calls per repetition (default 2)")  # fmt: skip
    p.add_argument("--budget", type=float, default=0.1,
                   help="target seconds per repetition (calls = budget / warm-up time per call, "
                        "within [--min-iters, --iters]); 0 = always --iters")  # fmt: skip
    p.add_argument(
        "--reps", type=int, default=5, help="repetitions per size and system (default 5)"
    )
    p.add_argument("--rounds", type=int, default=None,
                   help="launches per system the repetitions are spread over, systems launched "
                        "in turns (default: --reps, one repetition per launch)")  # fmt: skip
    p.add_argument(
        "--backends",
        default=None,
        help="comma list from stragg,gloo,mpi (default: all three; gloo only, with a note, when "
        "stragg cannot be imported; mpi skipped, with a note, when mpirun/mpi4py are absent)",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="collective timeout, seconds")
    p.add_argument("--json", action="store_true", help="print one JSON list of rows, nothing else")
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="also draw time and busbw vs size, one line per system")  # fmt: skip
    args = p.parse_args(argv)
    if args.ranks < 2:
        p.error("--ranks must be >= 2")
    if args.iters < 1 or args.warmup < 0 or args.min_iters < 1 or args.reps < 1:
        p.error("--iters, --min-iters and --reps must be >= 1, --warmup >= 0")
    args.rounds = args.reps if args.rounds is None else args.rounds
    if not 1 <= args.rounds <= args.reps:
        p.error("--rounds must be between 1 and --reps")
    args.min_iters = min(args.min_iters, args.iters)
    sizes = args.sizes if args.sizes is not None else default_sizes()
    for s in sizes:
        if s <= 0 or s % ELEM:
            p.error(f"size {s} B is not a positive multiple of {ELEM} (float32)")
    args.sizes = sizes
    return args


def choose_systems(args: argparse.Namespace) -> tuple[list[str], str] | None:
    """(systems to run, note on stragg) or None after saying why on stderr."""
    note = ""
    if args.backends is None:
        systems = list(SYSTEMS)
        mod, why = import_stragg()
        if mod is None:
            systems.remove("stragg")
            note = why
            eprint(f"allreduce.py: stragg unavailable ({why}); benchmarking without it")
        missing = mpi_unavailable()
        if missing:
            systems.remove("mpi")
            eprint(f"allreduce.py: OpenMPI column skipped: {missing}")
        return systems, note
    systems = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown or not systems or len(set(systems)) != len(systems):
        eprint(f"allreduce.py: --backends must list stragg, gloo and/or mpi, got {args.backends!r}")
        return None
    if "stragg" in systems:
        mod, why = import_stragg()
        if mod is None:
            eprint(f"allreduce.py: stragg requested but unavailable: {why}")
            return None
    if "mpi" in systems and mpi_unavailable():
        eprint(f"allreduce.py: mpi requested but unavailable: {mpi_unavailable()}")
        return None
    return systems, note


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    chosen = choose_systems(args)
    if chosen is None:
        return 2
    systems, note = chosen
    cfg = Config(
        ranks=args.ranks,
        sizes=args.sizes,
        backends=[s for s in systems if s != "mpi"],
        iters=args.iters,
        warmup=args.warmup,
        min_iters=args.min_iters,
        budget_s=args.budget,
        reps=1,
        timeout_s=args.timeout,
        json=args.json,
        stragg_note=note,
    )
    result = collect(args, cfg, systems)
    if result is None:
        return 1
    rows, info = result
    model = _ring_model(rows, cfg.ranks)
    if args.json:
        print(json.dumps(rows))
    else:
        print_table(rows, systems, cfg, args, info)
        if model:
            _print_model(rows, model)
    if args.plot:
        plot(rows, systems, cfg.ranks, args.plot)
        if not args.json:
            print(f"# plot: {args.plot}")
    return 0


def _ring_model(rows: list[dict[str, Any]], n: int) -> dict[str, float] | None:
    """Fits the Ring alpha-beta model (stragg.sim) to the stragg rows; each gains
    "model_time_s"."""
    mine = [r for r in rows if r["backend"] == "stragg"]
    fit = fit_ring_alpha_beta(n, [r["bytes"] for r in mine], [r["time_s"] for r in mine])
    if fit is None:
        return None
    import stragg.schedule
    import stragg.sim

    alpha, beta = fit
    ring = stragg.schedule.build("ring", n)
    for r in mine:
        r["model_time_s"] = stragg.sim.simulate(ring, r["bytes"], alpha, beta).time
    return {"alpha_s": alpha, "beta_s_per_byte": beta}


def _print_model(rows: list[dict[str, Any]], model: dict[str, float]) -> None:
    print(
        f"# cost model (alpha-beta, stragg.sim on the Ring schedule) fitted to the stragg rows: "
        f"alpha = {model['alpha_s'] * 1e6:.1f} us per round, "
        f"1/beta = {1e-9 / model['beta_s_per_byte']:.2f} GB/s per link"
        if model["beta_s_per_byte"] > 0
        else "# cost model: degenerate fit"
    )
    print(f"# {'size':>11} {'stragg(us)':>11} {'model(us)':>10} {'meas/model':>10}")
    for r in rows:
        if r["backend"] == "stragg" and "model_time_s" in r and r["model_time_s"] > 0:
            print(
                f"  {r['bytes']:11d} {r['time_s'] * 1e6:11.1f} {r['model_time_s'] * 1e6:10.1f} "
                f"{r['time_s'] / r['model_time_s']:10.2f}"
            )


if __name__ == "__main__":
    sys.exit(main())
