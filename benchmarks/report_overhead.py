"""What the straggler report, torch's flight recorder and a torch.profiler trace cost all_reduce.

Launches of `--ranks` ranks on this host alternate the flight recorder off and on
(TORCH_FR_BUFFER_SIZE unset / set: it is on or off for a whole process), `--pairs` times. In each
launch, `--group-pairs` pairs of stragg groups identical except the straggler profiler that the
report reads (STRAGG_PROFILE on, the default, and off), and for every size, `--repeats` times:
`--iters-*` back-to-back all_reduce calls on the report-on group and on the report-off group of
one pair (the pairs in turn), which goes first alternating, so machine noise hits both alike.
Several pairs, because a group's placement alone (its shared memory, its threads) shifts its
calls by up to 2% in some launches: a single pair read that as the report's cost, and a control
run (`--control`, every group report-off) as a 1.022 "overhead". Then as many repetitions of a report-on
group outside and inside torch.profiler (CPU, record_shapes: the trace's args). The trace has
its own phase because a profiler session's teardown slows the calls after it: a rotation of all
three put it before one group only. Python's garbage collector is paused in the timed loops
(as timeit does): its pauses hit both groups alike and only add noise. A repetition's time is
the mean per call on the slowest rank. Prints, per size, the median and range over the
repetitions (of the recorder-off launches) of each ratio:

    report      report on / report off            (same launch, interleaved; per repetition)
    own time    the profiler's time in exchanges and link probes per report-on call, counted
                in the process (rank 0; no machine noise, but not the per-call bookkeeping)
    trace       profiler trace on / off           (same launch, interleaved; per repetition)
    recorder    flight recorder on / off          (report on; per pair of launches, the ratio of
                                                   their median calls)

Both groups run the planner's choice with straggler "none", so the report cannot change the
algorithm (it would not without a late rank either); the algorithms each group ran are printed.
A repetition runs at least one exchange period of the report-on group (its calls per exchange,
up to 4096 for 4 KiB calls), so that every repetition pays for one exchange: a median over
shorter repetitions, most without one, would leave the exchanges out.

    python benchmarks/report_overhead.py --ranks 4 --sizes 4KiB,64MiB --repeats 31 --pairs 2
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

# The sibling _common.py is importable because Python puts this script's directory on sys.path.
from _common import (
    Stats,
    eprint,
    parse_size,
    parse_sizes,
    spawn_and_collect,
    start_overhead_worker,
)

ON, OFF, TRACE = "report-on", "report-off", "report-on+trace"
UNTRACED = "report-on, trace phase"  # the trace's baseline: the report-on group in its phase
_FIRST_PROBE_ROUNDS = 200  # warm-up rounds at most, waiting for the first link probe to end
_LONGEST_EXCHANGE_PERIOD = 4096  # calls per profiler exchange at most (session/group_profiler_tuning.h)
FR_SIZE = "2000"  # TORCH_FR_BUFFER_SIZE when the recorder is on (torch's documented example)


@dataclass
class Config:
    ranks: int
    control: bool
    group_pairs: int
    sizes: list[int]
    repeats: int
    iters_small: int
    iters_large: int
    large_from: int


def _group(report: bool, timeout: datetime.timedelta) -> Any:
    import stragg
    import stragg.profiler

    stragg.set_policy(straggler="none")
    stragg.profiler.configure(enabled=report)
    try:
        return dist.new_group(backend="stragg", timeout=timeout)
    finally:
        stragg.reset_policy()


def _timed(buf: torch.Tensor, group: Any, iters: int, trace: bool) -> float:
    """Mean seconds per call on the slowest rank."""
    dist.barrier()
    gc.disable()
    try:
        elapsed = _loop(buf, group, iters, trace)
    finally:
        gc.enable()
    t = torch.tensor([elapsed / iters], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # on the default (gloo) group
    return float(t.item())


def _loop(buf: torch.Tensor, group: Any, iters: int, trace: bool) -> float:
    if trace:
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
        ):
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(buf, group=group)
            elapsed = time.perf_counter() - t0
    else:
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf, group=group)
        elapsed = time.perf_counter() - t0
    return elapsed


def worker(rank: int, cfg: Config, result_path: str) -> None:
    stragg_mod = start_overhead_worker(rank, cfg.ranks)
    timeout = datetime.timedelta(seconds=300)
    # Created alternately: a group's own placement (its shared memory, its threads) shifts its
    # calls by up to 2% in some launches, which a single pair would read as the report's cost.
    groups: dict[str, list[Any]] = {ON: [], OFF: []}
    for _ in range(cfg.group_pairs):
        groups[ON].append(_group(not cfg.control, timeout))
        groups[OFF].append(_group(False, timeout))
    results: dict[str, dict[str, list[float]]] = {}
    own: dict[str, float] = {}
    algorithms: dict[str, dict[str, list[str]]] = {}
    iters_used: dict[str, int] = {}
    for size in cfg.sizes:
        buf = torch.ones(size // 4)
        iters = cfg.iters_large if size >= cfg.large_from else cfg.iters_small
        for g in groups[ON] + groups[OFF]:  # warm-up: buffers, profiler state
            _timed(buf, g, max(2, iters // 4), trace=False)
        if not cfg.control:
            for g in groups[ON]:
                _settle(buf, g, iters)
        if size < cfg.large_from:
            # Whole exchange periods (every rank holds the same period; a control run, with no
            # profiler, the longest period, as a report-on run at 4 KiB settles on).
            every = (_LONGEST_EXCHANGE_PERIOD if cfg.control
                     else max(_profiler(g)["exchange_every"] for g in groups[ON]))
            iters = -(-iters // every) * every
        key = str(size)
        iters_used[key] = iters
        before = [_own_cost(g) for g in groups[ON]]
        results[key] = {name: [] for name in (ON, OFF, UNTRACED, TRACE)}
        for rep in range(cfg.repeats):
            j = rep % cfg.group_pairs
            pair = ((ON, groups[ON][j]), (OFF, groups[OFF][j]))
            for name, group in (pair if (rep // cfg.group_pairs) % 2 == 0 else pair[::-1]):
                results[key][name].append(_timed(buf, group, iters, trace=False))
        traced = ((UNTRACED, False), (TRACE, True))
        for rep in range(cfg.repeats):
            for name, trace in (traced if rep % 2 == 0 else traced[::-1]):
                results[key][name].append(_timed(buf, groups[ON][0], iters, trace))
        after = [_own_cost(g) for g in groups[ON]]
        own[key] = (sum(a[0] - b[0] for a, b in zip(after, before))
                    / max(1, sum(a[1] - b[1] for a, b in zip(after, before))))
        algorithms[key] = {
            name: sorted({c["algorithm"] for g in groups[name]
                          for c in stragg_mod.recent_calls(g)[-iters:]})
            for name in (ON, OFF)
        }
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump({"results": results, "algorithms": algorithms, "own_s": own,
                       "iters": iters_used}, f)
    for g in groups[ON] + groups[OFF]:
        dist.destroy_process_group(g)
    dist.destroy_process_group()


def _settle(buf: torch.Tensor, group: Any, iters: int) -> None:
    """Runs `group` past its first link probe and until its exchange period stops changing."""
    # The job's first link probe (up to STRAGG_PROBE_BUDGET, 5%, of the time until it ends) is
    # a one-time cost; the repetitions measure what a job pays from then on.
    for _ in range(_FIRST_PROBE_ROUNDS):
        probed = torch.tensor([_profiler(group)["probes"]["campaigns"]], dtype=torch.int64)
        dist.all_reduce(probed, op=dist.ReduceOp.MIN)  # every rank loops alike
        if probed.item() > 0:
            break
        _timed(buf, group, max(2, iters // 4), trace=False)
    every = 0
    for _ in range(4):
        if every == _profiler(group)["exchange_every"]:
            break
        every = _profiler(group)["exchange_every"]
        _timed(buf, group, 2 * every, trace=False)


def _profiler(group: Any) -> dict[str, Any]:
    import stragg.profiler

    return stragg.profiler.summary(group)


def _own_cost(group: Any) -> tuple[float, int]:
    """The profiler's seconds in exchanges and probes so far on this rank, and its calls."""
    s = _profiler(group)
    return s["exchange_seconds"] + s["probes"]["seconds"], s["calls"]


def _ratios(num: list[float], den: list[float]) -> Stats:
    return Stats.of([a / b for a, b in zip(num, den)])


def _fmt(st: Stats) -> str:
    return f"{st.median:.3f} [{st.minimum:.3f}, {st.maximum:.3f}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--sizes", type=parse_sizes, default=parse_sizes("4KiB,64MiB"))
    p.add_argument("--repeats", type=int, default=31, help="repetitions per launch")
    p.add_argument("--pairs", type=int, default=2, help="pairs of launches (recorder off, on)")
    p.add_argument("--iters-small", type=int, default=300, help="calls per repetition < 1 MiB")
    p.add_argument("--iters-large", type=int, default=3, help="calls per repetition >= 1 MiB")
    p.add_argument("--group-pairs", type=int, default=3,
                   help="report-on/off pairs of groups per launch, taken in turn")
    p.add_argument("--control", action="store_true",
                   help="both groups report-off: the benchmark's own reading of no difference")
    p.add_argument("--json", action="store_true", help="print one JSON object, nothing else")
    a = p.parse_args(argv)
    import stragg  # noqa: F401  (fail early, in the parent, if stragg is missing)

    cfg = Config(a.ranks, a.control, a.group_pairs, a.sizes, a.repeats, a.iters_small, a.iters_large,
                 parse_size("1MiB"))
    # Launches alternate recorder off / on, `--pairs` times: each pair's ratio compares two
    # launches close in time.
    launches: dict[str, list[Any]] = {"recorder-off": [], "recorder-on": []}
    saved = os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
    try:
        for _ in range(a.pairs):
            for fr, value in (("recorder-off", None), ("recorder-on", FR_SIZE)):
                if value is not None:
                    os.environ["TORCH_FR_BUFFER_SIZE"] = value
                out = spawn_and_collect(worker, cfg, a.ranks, "report_overhead")
                os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
                if out is None:
                    return 1
                launches[fr].append(out)
    finally:
        if saved is not None:
            os.environ["TORCH_FR_BUFFER_SIZE"] = saved
    rows = []
    for size in a.sizes:
        key = str(size)
        offs = [launch["results"][key] for launch in launches["recorder-off"]]
        ons = [launch["results"][key] for launch in launches["recorder-on"]]
        pooled = {name: [x for r in offs for x in r[name]]
                  for name in (ON, OFF, UNTRACED, TRACE)}
        rows.append({
            "bytes": size,
            "call_s": {k: Stats.of(v).median for k, v in pooled.items()},
            "report_ratio": _ratios(pooled[ON], pooled[OFF]).__dict__,
            "own_s_per_call": Stats.of([launch["own_s"][key] for launch in launches["recorder-off"]]
                                       ).median,
            "trace_ratio": _ratios(pooled[TRACE], pooled[UNTRACED]).__dict__,
            # Per pair of launches: median call (report on) with the recorder / without.
            "recorder_ratio": Stats.of([Stats.of(on[ON]).median / Stats.of(off[ON]).median
                                        for on, off in zip(ons, offs)]).__dict__,
            "recorder_report_ratio": _ratios([x for r in ons for x in r[ON]],
                                             [x for r in ons for x in r[OFF]]).__dict__,
            "algorithms": launches["recorder-off"][0]["algorithms"][key],
            "calls_per_repetition": launches["recorder-off"][0]["iters"][key],
        })
    doc = {"ranks": a.ranks, "control": a.control, "group_pairs": a.group_pairs, "repeats": a.repeats, "pairs": a.pairs, "iters_small": a.iters_small,
           "iters_large": a.iters_large, "rows": rows}
    if a.json:
        print(json.dumps(doc))
        return 0
    print(f"# report / trace / flight recorder overhead: {a.ranks} ranks on one host, "
          f"{a.pairs} x 2 launches of {a.repeats} repetitions; ratios: median [min, max]"
          + ("; CONTROL: both groups report-off" if a.control else ""))
    for r in rows:
        c = r["call_s"]
        print(f"  {r['bytes'] / 2**10:>8g} KiB  per call: report on {c[ON] * 1e6:.1f} us, off "
              f"{c[OFF] * 1e6:.1f} us, traced {c[TRACE] * 1e6:.1f} us; algorithms on "
              f"{r['algorithms'][ON]} off {r['algorithms'][OFF]}; "
              f"{r['calls_per_repetition']} calls per repetition")
        report = Stats(**r["report_ratio"])
        print(f"    report on/off          {_fmt(report)}   target <= 1.02: "
              f"{'PASS' if report.median <= 1.02 else 'FAIL'}")
        print(f"    own time               {r['own_s_per_call'] * 1e6:.3f} us per call "
              f"({r['own_s_per_call'] / c[ON] * 100:.2f}% of a report-on call)")
        print(f"    trace on/off           {_fmt(Stats(**r['trace_ratio']))}")
        print(f"    recorder on/off        {_fmt(Stats(**r['recorder_ratio']))} (over {a.pairs} "
              "pairs of launches; with the recorder, report on/off "
              f"{_fmt(Stats(**r['recorder_report_ratio']))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
