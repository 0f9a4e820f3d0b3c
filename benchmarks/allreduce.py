"""all_reduce benchmark: stragg vs Gloo in the same processes, nccl-tests-style table.

    python benchmarks/allreduce.py --ranks 4
    python benchmarks/allreduce.py --ranks 4 --sizes 4KiB,1MiB,64MiB --iters 20 --warmup 5
    python benchmarks/allreduce.py --ranks 4 --json > allreduce.json

The script spawns the ranks itself (torch.multiprocessing, start method 'spawn'). Every rank
initialises the default group with Gloo (used only for control: the MAX of per-rank durations
and of the result-check flags) and creates one group per backend under test with
`dist.new_group(backend=...)`. For each size the backends are interleaved iteration by
iteration (order alternating) so that machine noise hits both alike.

One iteration of backend B: refill the buffer from a per-rank source pattern, barrier on B's
group, time `dist.all_reduce(buf, SUM, group=B)` on every rank, then (outside the timed region)
all_reduce the duration with MAX over the control group. Reported time = median over the
measured iterations of that per-iteration max; spread = min/max (and IQR in --json).
algbw = bytes / time / 1e9, busbw = algbw * 2(n-1)/n (nccl-tests convention).

The first warm-up and the last measured iteration of every (size, backend) are checked exactly
against the expected sum (integer-valued float32 data, so any summation order is exact); a
mismatch aborts the run instead of reporting a broken all_reduce as fast.

Iterations: `--warmup` and `--iters` are upper bounds; for large sizes the count is reduced so
that each (size, backend) measures for about `--budget` seconds, never below `--min-iters`
(default 5) measured iterations. `--budget 0` always runs exactly `--iters`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

# Python puts this script's directory first on sys.path (also in the spawned ranks): the
# sibling _common.py is found from any working directory; stragg itself is the installed one.
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


@dataclass
class Config:
    ranks: int
    sizes: list[int]
    backends: list[str]
    iters: int
    warmup: int
    min_iters: int
    budget_s: float
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
    if calls is not None:
        msg += f", allreduce_calls +{calls} for {issued} timed all_reduces"
    if delegated is not None:
        msg += f", delegated_calls +{delegated} (barriers etc.)"
    if transport == "gloo" or (calls is not None and calls < issued):
        msg += "  WARNING: stragg all_reduce was (partly) delegated to Gloo"
    return msg


def _print_header(cfg: Config, info: dict[str, str]) -> None:
    n = cfg.ranks
    print(
        f"# stragg all_reduce benchmark: {n} ranks, float32, sum, "
        f"{os.cpu_count()} CPUs visible, torch {torch.__version__}"
    )
    print(
        f"# time = median over measured iterations of max-over-ranks all_reduce time; "
        f"min/max over the same iterations; busbw = algbw * 2(n-1)/n = algbw * {bus_factor(n):.3f}"
    )
    print(
        f"# iterations: warm-up <= {cfg.warmup}, measured <= {cfg.iters} "
        f"(>= {cfg.min_iters}; budget {cfg.budget_s:g} s per size and backend)"
    )
    for k, v in info.items():
        print(f"# {k}: {v}")
    if cfg.stragg_note:
        print(f"# stragg unavailable ({cfg.stragg_note}); running gloo only")
    blk = f"{'time(us)':>10} {'min(us)':>10} {'max(us)':>10} {'algbw':>7} {'busbw':>7}"
    blk_units = f"{'':>10} {'':>10} {'':>10} {'(GB/s)':>7} {'(GB/s)':>7}"
    line1 = "#" + " " * 28
    line2 = "#" + f"{'size':>11} {'count':>10} {'iters':>5}"
    line3 = "#" + f"{'(B)':>11} {'(elements)':>10} {'':>5}"
    for b in cfg.backends:
        line1 += " | " + f" {b} ".center(len(blk), "-")
        line2 += " | " + blk
        line3 += " | " + blk_units
    if len(cfg.backends) == 2:
        line1 += " | " + f"{cfg.backends[0]}/{cfg.backends[1]}".center(15)
        line2 += " | " + f"{'busbw':>7} {'time':>7}"
    print(line1.rstrip())
    print(line2)
    print(line3.rstrip(), flush=True)


def _print_row(cfg: Config, nbytes: int, rows: list[dict[str, Any]]) -> None:
    r0 = rows[0]
    s = f" {nbytes:11d} {nbytes // ELEM:10d} {r0['iters']:5d}"
    for r in rows:
        s += (
            f" | {r['time_s'] * 1e6:10.1f} {r['time_min_s'] * 1e6:10.1f} "
            f"{r['time_max_s'] * 1e6:10.1f} {r['algbw_gbps']:7.3f} {r['busbw_gbps']:7.3f}"
        )
    if len(rows) == 2:
        a, b = rows
        s += f" | {a['busbw_gbps'] / b['busbw_gbps']:7.2f} {a['time_s'] / b['time_s']:7.2f}"
    print(s, flush=True)


def _print_footer(cfg: Config, all_rows: list[dict[str, Any]]) -> None:
    for b in cfg.backends:
        bw = [r["busbw_gbps"] for r in all_rows if r["backend"] == b]
        if bw:
            print(f"# {b}: avg bus bandwidth {sum(bw) / len(bw):.3f} GB/s over {len(bw)} sizes")
    if len(cfg.backends) == 2:
        a, b = cfg.backends
        ratios = [
            ra["busbw_gbps"] / rb["busbw_gbps"]
            for ra in all_rows
            if ra["backend"] == a
            for rb in all_rows
            if rb["backend"] == b and rb["bytes"] == ra["bytes"]
        ]
        if ratios:
            geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
            print(
                f"# {a}/{b} busbw ratio: geometric mean {geo:.2f}, "
                f"min {min(ratios):.2f}, max {max(ratios):.2f} (> 1: {a} faster)"
            )
    sys.stdout.flush()


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

    info: dict[str, str] = {}
    stats0: dict[str, Any] = {}
    if "stragg" in groups:
        stats0 = stragg_stats(stragg_mod, groups["stragg"])
        if stats0:
            info["stragg backend_stats"] = json.dumps(stats0, sort_keys=True)
    if rank == 0 and not cfg.json:
        _print_header(cfg, info)

    issued = {b: 0 for b in cfg.backends}

    def run_iter(
        b: str,
        src: torch.Tensor,
        expected: torch.Tensor,
        buf: torch.Tensor,
        check: bool,
    ) -> float:
        g = groups[b]
        buf.copy_(src)
        dist.barrier(group=g)
        t0 = time.perf_counter()
        dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=g)
        dt = time.perf_counter() - t0
        issued[b] += 1
        # [duration, bad_0, ..., bad_{n-1}], MAX over ranks: same values on every rank.
        stat = torch.zeros(1 + n, dtype=torch.float64)
        stat[0] = dt
        local_bad = check and not torch.equal(buf, expected)
        if local_bad:
            stat[1 + rank] = 1.0
        dist.all_reduce(stat, op=dist.ReduceOp.MAX, group=ctrl)
        bad_ranks = [r for r in range(n) if stat[1 + r] > 0]
        if bad_ranks:
            detail = mismatch_detail(buf, expected) if local_bad else ""
            details: list[Any] = [None] * n
            dist.all_gather_object(details, detail, group=ctrl)
            per_rank = "; ".join(f"rank {r}: {details[r]}" for r in bad_ranks)
            raise VerificationError(
                f"{b} all_reduce(SUM, float32, {buf.numel() * ELEM} bytes, {n} ranks) "
                f"returned wrong results on ranks {bad_ranks} ({per_rank})"
            )
        return float(stat[0])

    all_rows: list[dict[str, Any]] = []
    for nbytes in cfg.sizes:
        src, expected, buf = make_data(nbytes, rank, n)
        # Warm-up; the first iteration of each backend is verified. The loop stops early once
        # warm-up has used half the budget (decision made on max-reduced values: same on all ranks).
        warm_time = {b: 0.0 for b in cfg.backends}
        warm_done = 0
        for i in range(max(1, cfg.warmup)):
            for b in cfg.backends:
                warm_time[b] += run_iter(b, src, expected, buf, check=(i == 0))
            warm_done += 1
            if cfg.budget_s > 0 and max(warm_time.values()) > cfg.budget_s / 2:
                break
        est = max(warm_time.values()) / warm_done
        iters = cfg.iters
        if cfg.budget_s > 0:
            iters = min(cfg.iters, max(cfg.min_iters, math.ceil(cfg.budget_s / max(est, 1e-9))))
        iters = max(iters, 1)

        samples: dict[str, list[float]] = {b: [] for b in cfg.backends}
        for i in range(iters):
            order = cfg.backends if i % 2 == 0 else cfg.backends[::-1]
            for b in order:
                samples[b].append(run_iter(b, src, expected, buf, check=(i == iters - 1)))
        del src, expected, buf

        rows = []
        for b in cfg.backends:
            st = Stats.of(samples[b])
            algbw = nbytes / st.median / 1e9
            row: dict[str, Any] = {
                "backend": b,
                "bytes": nbytes,
                "time_s": st.median,
                "algbw_gbps": algbw,
                "busbw_gbps": algbw * bus_factor(n),
                "time_min_s": st.minimum,
                "time_max_s": st.maximum,
                "time_p25_s": st.p25,
                "time_p75_s": st.p75,
                "iters": st.count,
                "warmup": warm_done,
                "ranks": n,
                "dtype": "float32",
                "op": "sum",
            }
            rows.append(row)
        all_rows.extend(rows)
        if rank == 0 and not cfg.json:
            _print_row(cfg, nbytes, rows)

    if "stragg" in groups:
        stats1 = stragg_stats(stragg_mod, groups["stragg"])
        transport = stats1.get("transport")
        if transport is not None:
            for r in all_rows:
                if r["backend"] == "stragg":
                    r["transport"] = transport
        msg = _stats_check(stats0, stats1, issued["stragg"])
        if rank == 0 and msg:
            if cfg.json:
                eprint("# " + msg)
            else:
                print("# " + msg)
    if rank == 0:
        if not cfg.json:
            _print_footer(cfg, all_rows)
        with open(result_path, "w") as f:
            json.dump(all_rows, f)
    dist.barrier(group=ctrl)
    for g in groups.values():
        dist.destroy_process_group(g)
    dist.destroy_process_group()


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
    p.add_argument("--iters", type=int, default=50, help="max measured iterations (default 50)")
    p.add_argument("--warmup", type=int, default=5, help="max warm-up iterations (default 5)")
    p.add_argument(
        "--min-iters",
        type=int,
        default=5,
        help="min measured iterations when the budget cuts --iters (default 5)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=2.0,
        help="target seconds of measurement per size and backend; 0 = always --iters",
    )
    p.add_argument(
        "--backends",
        default=None,
        help="comma list from stragg,gloo (default: both; gloo only, with a note, "
        "when stragg cannot be imported)",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="collective timeout, seconds")
    p.add_argument("--json", action="store_true", help="print one JSON list of rows, nothing else")
    args = p.parse_args(argv)
    if args.ranks < 2:
        p.error("--ranks must be >= 2")
    if args.iters < 1 or args.warmup < 0 or args.min_iters < 1:
        p.error("--iters and --min-iters must be >= 1, --warmup >= 0")
    args.min_iters = min(args.min_iters, args.iters)
    sizes = args.sizes if args.sizes is not None else default_sizes()
    for s in sizes:
        if s <= 0 or s % ELEM:
            p.error(f"size {s} B is not a positive multiple of {ELEM} (float32)")
    args.sizes = sizes
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    note = ""
    if args.backends is None:
        backends = ["stragg", "gloo"]
        mod, why = import_stragg()
        if mod is None:
            backends, note = ["gloo"], why
            eprint(f"allreduce.py: stragg unavailable ({why}); benchmarking gloo only")
    else:
        backends = [b.strip() for b in args.backends.split(",") if b.strip()]
        unknown = sorted(set(backends) - {"stragg", "gloo"})
        if unknown or not backends or len(set(backends)) != len(backends):
            eprint(f"allreduce.py: --backends must list stragg and/or gloo, got {args.backends!r}")
            return 2
        if "stragg" in backends:
            mod, why = import_stragg()
            if mod is None:
                eprint(f"allreduce.py: stragg requested but unavailable: {why}")
                return 2
    cfg = Config(
        ranks=args.ranks,
        sizes=args.sizes,
        backends=backends,
        iters=args.iters,
        warmup=args.warmup,
        min_iters=args.min_iters,
        budget_s=args.budget,
        timeout_s=args.timeout,
        json=args.json,
        stragg_note=note,
    )
    rows = spawn_and_collect(worker, cfg, cfg.ranks, "allreduce.py")
    if rows is None:
        return 1
    model = _ring_model(rows, cfg.ranks)
    if args.json:
        print(json.dumps(rows))
    elif model:
        _print_model(rows, model)
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
