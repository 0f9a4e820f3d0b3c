"""Profiler overhead: the same all_reduce loop on a stragg group with the profiler on and off.

Two stragg groups over the same ranks, identical except STRAGG_PROFILE (and STRAGG_ALGO=ring, so
the profiler observes but does not change the algorithm: the difference is its bookkeeping, the
exchange every K calls and the periodic link probes). Iterations alternate between the groups so
machine noise hits both alike; each iteration is `--compute-ms` of simulated compute followed by
one all_reduce of `--size`. Reports the mean step time of each group, the overhead per step and
as a share of the step, repeated `--repeats` times (median and spread), next to gloo's step time.

    python benchmarks/profiler_overhead.py --ranks 4 --size 4MiB --steps 400 --compute-ms 20
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

# The sibling _common.py is importable because Python puts this script's directory on sys.path.
from _common import Stats, eprint, parse_size, spawn_and_collect, start_overhead_worker

ON, OFF, GLOO = "stragg-profile-on", "stragg-profile-off", "gloo"


@dataclass
class Config:
    ranks: int
    size: int
    steps: int
    compute_s: float
    repeats: int
    every: int


def _group(profile: bool, every: int, timeout: datetime.timedelta) -> Any:
    """A stragg group fixed to Ring, with the profiler on or off (stragg's Python settings)."""
    import stragg
    import stragg.profiler

    stragg.set_policy(algo="ring")
    stragg.profiler.configure(enabled=profile, every=every)
    try:
        return dist.new_group(backend="stragg", timeout=timeout)
    finally:
        stragg.reset_policy()


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def worker(rank: int, cfg: Config, result_path: str) -> None:
    start_overhead_worker(rank, cfg.ranks)
    timeout = datetime.timedelta(seconds=300)
    groups = {
        ON: _group(True, cfg.every, timeout),
        OFF: _group(False, cfg.every, timeout),
        GLOO: dist.new_group(),
    }
    buf = torch.ones(cfg.size // 4)
    results: dict[str, list[float]] = {k: [] for k in groups}
    for _ in range(cfg.repeats):
        step_times: dict[str, list[float]] = {k: [] for k in groups}
        for i in range(cfg.steps):
            order = list(groups) if i % 2 == 0 else list(reversed(groups))
            for name in order:
                dist.barrier()
                t0 = time.perf_counter()
                _busy(cfg.compute_s)
                dist.all_reduce(buf, group=groups[name])
                step_times[name].append(time.perf_counter() - t0)
        for name, times in step_times.items():
            t = torch.tensor([sum(times) / len(times)], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's mean step
            results[name].append(float(t.item()))
    import stragg.profiler

    summary = stragg.profiler.summary(groups[ON])
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump({"results": results, "exchanges": summary["exchanges"],
                       "link_source": summary["link"]["source"]}, f)
    for g in groups.values():
        dist.destroy_process_group(g)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--size", type=parse_size, default=parse_size("4MiB"))
    p.add_argument("--steps", type=int, default=300, help="steps per group per repeat")
    p.add_argument("--compute-ms", type=float, default=20.0, help="simulated compute per step")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--every", type=int, default=16, help="STRAGG_PROFILE_EVERY (K)")
    p.add_argument("--json", action="store_true", help="print one JSON object, nothing else")
    a = p.parse_args(argv)
    import stragg.profiler  # noqa: F401  (fail early, in the parent, if stragg is missing)

    cfg = Config(a.ranks, a.size, a.steps, a.compute_ms * 1e-3, a.repeats, a.every)
    out = spawn_and_collect(worker, cfg, a.ranks, "profiler_overhead")
    if out is None:
        return 1
    res = out["results"]
    overhead = [on / off - 1.0 for on, off in zip(res[ON], res[OFF])]
    ov = Stats.of(overhead)
    doc = {
        "ranks": a.ranks,
        "bytes": a.size,
        "compute_s": cfg.compute_s,
        "steps": a.steps,
        "repeats": a.repeats,
        "every": a.every,
        "step_s": {k: Stats.of(v).median for k, v in res.items()},
        "overhead_share_median": ov.median,
        "overhead_share_min": ov.minimum,
        "overhead_share_max": ov.maximum,
        "exchanges": out["exchanges"],
        "link_source": out["link_source"],
    }
    if a.json:
        print(json.dumps(doc))
        return 0
    print(
        f"# profiler overhead: {a.ranks} ranks, all_reduce {a.size / 2**20:g} MiB float32 + "
        f"{a.compute_ms:g} ms compute per step, {a.steps} steps x {a.repeats} repeats, K={a.every} "
        f"({out['exchanges']} exchanges in the on-group, cost model {out['link_source']})"
    )
    for k in (OFF, ON, GLOO):
        st = Stats.of(res[k])
        print(f"  {k:<20} mean step {st.median * 1e3:8.3f} ms  [{st.minimum * 1e3:.3f}, "
              f"{st.maximum * 1e3:.3f}]")
    print(
        f"  overhead (on/off - 1): median {ov.median * 100:+.2f}% [{ov.minimum * 100:+.2f}%, "
        f"{ov.maximum * 100:+.2f}%]  target < 2%: {'PASS' if ov.median < 0.02 else 'FAIL'}"
    )
    eprint("(stragg vs gloo step ratio: "
           f"{Stats.of(res[GLOO]).median / Stats.of(res[OFF]).median:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
