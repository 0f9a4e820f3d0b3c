"""What the straggler report, torch's flight recorder and a torch.profiler trace cost all_reduce.

Launches of `--ranks` ranks on this host alternate the flight recorder off and on
(TORCH_FR_BUFFER_SIZE unset / set: it is on or off for a whole process), `--pairs` times. In each
launch, two stragg groups identical except the straggler profiler that the report reads
(STRAGG_PROFILE on, the default, and off), and for every size, `--repeats` times: `--iters-*`
back-to-back all_reduce calls on the report-on group and on the report-off group, which goes
first alternating, so machine noise hits both alike; then as many repetitions of the report-on
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
FR_SIZE = "2000"  # TORCH_FR_BUFFER_SIZE when the recorder is on (torch's documented example)


@dataclass
class Config:
    ranks: int
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
    groups = {ON: _group(True, timeout), OFF: _group(False, timeout)}
    results: dict[str, dict[str, list[float]]] = {}
    own: dict[str, float] = {}
    algorithms: dict[str, dict[str, list[str]]] = {}
    for size in cfg.sizes:
        buf = torch.ones(size // 4)
        iters = cfg.iters_large if size >= cfg.large_from else cfg.iters_small
        for name in (ON, OFF):  # warm-up: buffers, profiler state
            _timed(buf, groups[name], max(2, iters // 4), trace=False)
        # The job's first link probe (up to STRAGG_PROBE_BUDGET, 5%, of the time until it ends) is
        # a one-time cost; the repetitions measure what a job pays from then on.
        for _ in range(_FIRST_PROBE_ROUNDS):
            probed = torch.tensor([_profiler(groups[ON])["probes"]["campaigns"]], dtype=torch.int64)
            dist.all_reduce(probed, op=dist.ReduceOp.MIN)  # every rank loops alike
            if probed.item() > 0:
                break
            _timed(buf, groups[ON], max(2, iters // 4), trace=False)
        key = str(size)
        before = _own_cost(groups[ON])
        results[key] = {name: [] for name in (ON, OFF, UNTRACED, TRACE)}
        phases = [((ON, groups[ON], False), (OFF, groups[OFF], False)),
                  ((UNTRACED, groups[ON], False), (TRACE, groups[ON], True))]
        for pair in phases:
            for rep in range(cfg.repeats):
                for name, group, trace in (pair if rep % 2 == 0 else pair[::-1]):
                    results[key][name].append(_timed(buf, group, iters, trace))
        after = _own_cost(groups[ON])
        own[key] = (after[0] - before[0]) / max(1, after[1] - before[1])
        algorithms[key] = {
            name: sorted({c["algorithm"] for c in stragg_mod.recent_calls(groups[name])[-iters:]})
            for name in (ON, OFF)
        }
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump({"results": results, "algorithms": algorithms, "own_s": own}, f)
    for g in groups.values():
        dist.destroy_process_group(g)
    dist.destroy_process_group()


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
    p.add_argument("--json", action="store_true", help="print one JSON object, nothing else")
    a = p.parse_args(argv)
    import stragg  # noqa: F401  (fail early, in the parent, if stragg is missing)

    cfg = Config(a.ranks, a.sizes, a.repeats, a.iters_small, a.iters_large, parse_size("1MiB"))
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
        })
    doc = {"ranks": a.ranks, "repeats": a.repeats, "pairs": a.pairs, "iters_small": a.iters_small,
           "iters_large": a.iters_large, "rows": rows}
    if a.json:
        print(json.dumps(doc))
        return 0
    print(f"# report / trace / flight recorder overhead: {a.ranks} ranks on one host, "
          f"{a.pairs} x 2 launches of {a.repeats} repetitions of {a.iters_small} (< 1 MiB) or "
          f"{a.iters_large} calls; ratios: median [min, max]")
    for r in rows:
        c = r["call_s"]
        print(f"  {r['bytes'] / 2**10:>8g} KiB  per call: report on {c[ON] * 1e6:.1f} us, off "
              f"{c[OFF] * 1e6:.1f} us, traced {c[TRACE] * 1e6:.1f} us; algorithms on "
              f"{r['algorithms'][ON]} off {r['algorithms'][OFF]}")
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
