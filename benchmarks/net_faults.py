"""DDP training across emulated hosts under network faults: Gloo and stragg side by side.

    sudo .venv/bin/python benchmarks/net_faults.py --json --plot net_faults.png > net_faults.json
    sudo .venv/bin/python benchmarks/net_faults.py --faults reset,flap --backends stragg --reps 3
    .venv/bin/python benchmarks/net_faults.py --from-json net_faults.json --plot net_faults.png

What it measures (issue 47, item 8): the training benchmark's job (benchmarks/training.py: the
demo's GPT-2 from examples/finetune.py, one gradient bucket = one all_reduce per step, AdamW,
fixed seeds) on P = --hosts emulated hosts (one rank each, started directly with RANK,
WORLD_SIZE, MASTER_ADDR set, or under torchrun with --launch torchrun; every NIC shaped with tc), --steps steps, and the fault injected when rank 0 has finished step F
(--fault-at):

  healthy-1nic  one NIC per host at R (--rate); no fault (the fault-free job of this shape)
  reset         every established TCP connection of host H reset (`ss -K` in its namespace)
  pair-cut      hosts A and B drop each other's packets for good (both still reach the others)
  flap          host H's only NIC out for --flap-seconds (default 10), then back by itself
  healthy-2nic  two NICs per host at R/2 each (both in GLOO_SOCKET_IFNAME, which stragg's
                STRAGG_SOCKET_IFNAME defaults to); no fault (the fault-free job of this shape)
  nic-loss      two NICs at R/2; host H's second NIC pulled for good (--restore-at F2: plugged
                back when rank 0 has finished step F2)

H = --host (default 2), A, B = --pair (default 1,2). Each backend's fault-free job of the
cluster shape (one NIC, two NICs) runs whenever a fault of that shape runs (and healthy-1nic with
healthy-2nic, for their ratio). Every job is a fresh job; the process-group timeout is
--pg-timeout (default 60 s), every job is killed after --timeout (default 300 s), and after one
rank fails the others get --fail-grace seconds to raise their own error before they are killed.

Every rank appends one JSON line per finished step to a progress file (its wall time, its loss,
for stragg its backend_stats() counters); the launcher polls rank 0's to inject the fault, and
reads every rank's afterwards, so steps completed are known also when the job dies. Reported per
(fault, backend): steps completed (fewest over the ranks), who died first and how (the first line
of the exception, per rank), the median step time of rank 0 before the fault (steps 4..F) and of
the last 10 steps (only steps after the fault), the largest step after the fault (the stall), the
final loss (mean over the ranks) against the same backend's fault-free job of the same shape
(relative difference), and for stragg: the counters that changed from the end of step F to the
end of the job (the step at which each first changed; counters whose names speak of faults are
listed first), the profiler's applied mode and plan checks, the plans of the calls after the
fault, and the cost model's step for the network after the fault (benchmarks/training.py's
candidates and simulate_plan: compute from the fault-free job + the simulated all_reduce; the
two-NIC shape is modelled as one link of R per host, i.e. both NICs carrying, and host H at R/2
after the NIC loss; a cut pair is modelled as a Ring avoiding it, which on one switch costs what
Ring costs).

--json: one JSON object (configuration, every job's per-rank progress and end records, the
summaries) as the last stdout line; progress and tables go to stderr. --plot F.png: one panel per
fault, step time per step (rank 0) per backend with the fault marked. --from-json F redraws
tables and plot. Needs root (network namespaces); every cluster is torn down whatever happens.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import eprint
from _training_worker import load_finetune, model_args
from training import GOODPUT, candidates, simulate_plan

HERE = Path(__file__).resolve().parent
WORKER = HERE / "_net_faults_worker.py"
FAULTS = ("reset", "nic-loss", "pair-cut", "flap", "healthy-2nic", "healthy-1nic")
BASELINE = {1: "healthy-1nic", 2: "healthy-2nic"}  # the fault-free job of each cluster shape
NICS = {"reset": 1, "pair-cut": 1, "flap": 1, "healthy-1nic": 1, "nic-loss": 2,
        "healthy-2nic": 2}
BACKENDS = ("gloo", "stragg")
COLORS = {"gloo": "tab:blue", "stragg": "tab:orange"}
BASE_PORT = 29500
BEFORE_FROM = 4  # "before the fault": steps BEFORE_FROM..F (1-based), past the warm-up
LAST = 10  # "the last steps": the last LAST steps of the job, only those after the fault
# Counters that change in every healthy step: left out of "what changed".
ROUTINE = {"allreduce_calls", "allreduce_bytes", "barrier_calls", "delegated_calls", "busy_us",
           "wait_us", "pre_arrival_us", "agreement_us", "streamed_bytes",
           "dynamic_straggler_calls", "dynamic_plain_calls", "last_straggler"}
FAULT_WORDS = re.compile(r"reconnect|resen[dt]|failover|cut|redial|retr|reset|nic|fail|relay",
                         re.IGNORECASE)


# --------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog="See the module docstring (benchmarks/net_faults.py) for what is measured.")
    p.add_argument("--faults", default=",".join(FAULTS),
                   help=f"comma list of {', '.join(FAULTS)} (default all)")
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma list of gloo, stragg")
    p.add_argument("--hosts", type=int, default=4, help="emulated hosts, one rank each (4)")
    p.add_argument("--rate", default="300mbit",
                   help="every host's bandwidth R (tc units); with two NICs R/2 each (300mbit)")
    p.add_argument("--steps", type=int, default=40, help="training steps per job (40)")
    p.add_argument("--fault-at", type=int, default=12,
                   help="inject the fault when rank 0 has finished step F (12)")
    p.add_argument("--restore-at", type=int, default=None,
                   help="nic-loss: plug the NIC back when rank 0 has finished this step")
    p.add_argument("--host", type=int, default=2, help="host of reset, flap, nic-loss (2)")
    p.add_argument("--pair", default="1,2", help="the two hosts of pair-cut (1,2)")
    p.add_argument("--flap-seconds", type=float, default=10.0, help="flap's outage, s (10)")
    p.add_argument("--pg-timeout", type=float, default=60.0,
                   help="process-group timeout of every job, s (60)")
    p.add_argument("--timeout", type=float, default=300.0, help="limit per job, s (300)")
    p.add_argument("--launch", choices=["direct", "torchrun"], default="direct",
                   help="direct (default): one process per host with RANK, WORLD_SIZE, ... set "
                        "by stragg.emucluster; torchrun: under torchrun's elastic agent, whose "
                        "own store connection a reset breaks (the agent then stops its worker)")
    p.add_argument("--fail-grace", type=float, default=15.0,
                   help="after a rank fails, the others' time to raise their own error (15)")
    p.add_argument("--reps", type=int, default=1,
                   help="jobs per (fault, backend), interleaved, backend order rotated (1)")
    p.add_argument("--alpha", type=float, default=50e-6,
                   help="the cost model's latency per round, s (50e-6)")
    p.add_argument("--stragg-env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment for the stragg jobs (repeatable)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object as the last stdout line (progress on stderr)")
    p.add_argument("--plot", default="", help="write a PNG: step time per step, fault marked")
    p.add_argument("--from-json", default="", metavar="F.json",
                   help="no run: tables (and --plot) from an earlier --json output")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="stream the jobs' output to stderr")
    g = p.add_argument_group("model and data (the training benchmark's: examples/finetune.py)")
    g.add_argument("--layers", type=int, default=2)
    g.add_argument("--d-model", type=int, default=256)
    g.add_argument("--heads", type=int, default=4)
    g.add_argument("--vocab", type=int, default=2048)
    g.add_argument("--seq", type=int, default=16)
    g.add_argument("--batch", type=int, default=1)
    g.add_argument("--lr", type=float, default=1e-3)
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--model", choices=("auto", "gpt2", "torch"), default="auto")
    args = p.parse_args(argv)
    if args.from_json:
        return args
    args.fault_list = [f.strip() for f in args.faults.split(",") if f.strip()]
    args.backend_list = [b.strip() for b in args.backends.split(",") if b.strip()]
    for name, got, allowed in (("--faults", args.fault_list, FAULTS),
                               ("--backends", args.backend_list, BACKENDS)):
        bad = [x for x in got if x not in allowed]
        if bad or not got:
            p.error(f"{name}: {', '.join(bad) or 'empty'}; choose from {', '.join(allowed)}")
    try:
        args.pair_hosts = tuple(int(x) for x in args.pair.split(","))
    except ValueError:
        p.error(f"--pair: expected two host numbers, got {args.pair!r}")
    if len(args.pair_hosts) != 2 or args.pair_hosts[0] == args.pair_hosts[1]:
        p.error(f"--pair: expected two different hosts, got {args.pair!r}")
    if args.hosts < 2 or not all(0 <= h < args.hosts for h in (args.host, *args.pair_hosts)):
        p.error("need --hosts >= 2 and --host, --pair among the hosts")
    if not 1 <= args.fault_at < args.steps:
        p.error("need 1 <= --fault-at < --steps")
    if args.restore_at is not None and not args.fault_at < args.restore_at < args.steps:
        p.error("need --fault-at < --restore-at < --steps")
    if args.reps < 1 or args.flap_seconds <= 0 or args.timeout <= 0 or args.pg_timeout <= 0:
        p.error("need --reps >= 1 and positive --flap-seconds, --timeout, --pg-timeout")
    for item in args.stragg_env:
        if "=" not in item:
            p.error(f"--stragg-env {item!r}: expected KEY=VALUE")
    return args


def shape_plan(faults: list[str]) -> dict[int, list[str]]:
    """NIC count -> the faults to run on that cluster shape, its fault-free job first."""
    shapes: dict[int, list[str]] = {}
    for f in faults:
        shapes.setdefault(NICS[f], []).append(f)
    if 2 in shapes and "healthy-2nic" in faults:
        shapes.setdefault(1, [])  # healthy-2nic is compared with healthy-1nic
    return {k: [BASELINE[k]] + [f for f in shapes[k] if f != BASELINE[k]]
            for k in sorted(shapes)}


# --------------------------------------------------------------------------------------------
# Running the jobs


def job_config(args: argparse.Namespace, backend: str, fault: str,
               progress_dir: str) -> dict[str, Any]:
    return {
        "backend": backend, "fault": fault, "steps": args.steps, "seed": args.seed,
        "model": args.model, "vocab": args.vocab, "seq": args.seq, "d_model": args.d_model,
        "layers": args.layers, "heads": args.heads, "batch": args.batch, "lr": args.lr,
        "pg_timeout_s": args.pg_timeout, "progress_dir": progress_dir,
    }


def job_env(args: argparse.Namespace, c: Any, cfg: dict[str, Any]) -> dict[str, str]:
    env = {"NET_FAULTS_CONFIG": json.dumps(cfg), "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    if c.nic_count > 1:
        # Every NIC, as a user with two NICs would configure Gloo (which then round-robins its
        # collectives over them); stragg's STRAGG_SOCKET_IFNAME defaults to this list.
        env["GLOO_SOCKET_IFNAME"] = ",".join(name for name, _addr in c.nics(0))
    if cfg["backend"] == "stragg":
        for item in args.stragg_env:
            key, _, value = item.partition("=")
            env[key.strip()] = value
    return env


def read_progress(path: Path) -> list[dict[str, Any]]:
    """The records of one progress file (a line still being written is skipped)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def steps_done(records: list[dict[str, Any]]) -> int:
    return max((r["step"] for r in records if r.get("kind") == "step"), default=0)


def fault_actions(args: argparse.Namespace, c: Any, fault: str) -> list[tuple[int, str, Any]]:
    """(after rank 0's step, what, action) of a fault, in order."""
    h, (a, b) = args.host, args.pair_hosts
    F = args.fault_at
    if fault == "reset":
        return [(F, f"reset every TCP connection of host {h}",
                 lambda: {"connections": c.reset_connections(h)})]
    if fault == "pair-cut":
        return [(F, f"cut hosts {a} and {b} from each other", lambda: c.cut_pair(a, b))]
    if fault == "flap":
        return [(F, f"pull host {h}'s NIC 0 for {args.flap_seconds:g} s",
                 lambda: c.pull(h, 0, seconds=args.flap_seconds))]
    if fault == "nic-loss":
        acts = [(F, f"pull host {h}'s NIC 1 for good", lambda: c.pull(h, 1))]
        if args.restore_at is not None:
            acts.append((args.restore_at, f"plug host {h}'s NIC 1 back", lambda: c.plug(h, 1)))
        return acts
    return []


def heal(args: argparse.Namespace, c: Any, fault: str) -> None:
    """Undoes a fault between jobs."""
    if fault == "pair-cut":
        c.heal_pair(*args.pair_hosts)
    elif fault == "flap":
        c.plug(args.host, 0)  # cancels the timer if it has not fired
    elif fault == "nic-loss":
        c.plug(args.host, 1)


def run_job(c: Any, args: argparse.Namespace, fault: str, backend: str, workdir: str,
            port: int) -> dict[str, Any]:
    """One job with its fault; returns every rank's records and the events."""
    pdir = Path(tempfile.mkdtemp(prefix=f"{fault}-{backend}-", dir=workdir))
    os.chmod(pdir, 0o777)
    cfg = job_config(args, backend, fault, str(pdir))
    env = job_env(args, c, cfg)
    actions = fault_actions(args, c, fault)
    events: list[dict[str, Any]] = []
    t0 = time.monotonic()
    deadline = t0 + args.timeout
    torchrun = args.launch == "torchrun"
    cmd = [str(WORKER)] if torchrun else [sys.executable, str(WORKER)]
    job = c.spawn(cmd, torchrun=torchrun, env=env, master_port=port,
                  output=sys.stderr if args.verbose else None)
    try:
        rank0 = pdir / "rank0.jsonl"
        while actions and job.running() and time.monotonic() < deadline:
            done = steps_done(read_progress(rank0))
            while actions and done >= actions[0][0]:
                after, what, act = actions.pop(0)
                ev: dict[str, Any] = {"after_step": after, "what": what, "t": time.time(),
                                      "rank0_steps": done, "store_port": port}
                try:
                    ev["detail"] = act()
                except Exception as e:  # noqa: BLE001 - reported; the job runs on
                    ev["error"] = f"{type(e).__name__}: {e}"
                events.append(ev)
                eprint(f"    after step {done} of rank 0: {what}"
                       + (f" FAILED: {ev['error']}" if "error" in ev else ""))
            if any(code not in (None, 0) for code in job.poll()):
                break  # a rank failed before the fault: job.wait does the rest
            time.sleep(0.05)
        res = job.wait(timeout=max(1.0, deadline - time.monotonic()), fail_fast=True,
                       fail_grace=args.fail_grace)
    finally:
        job.kill()
        heal(args, c, fault)
    wall = time.monotonic() - t0
    ranks = []
    for path in sorted(pdir.glob("rank*.jsonl"), key=lambda p: int(p.stem[4:])):
        recs = read_progress(path)
        start = next((r for r in recs if r.get("kind") == "start"), {})
        end = next((r for r in recs if r.get("kind") == "end"), None)
        ranks.append({"rank": int(path.stem[4:]), "host": start.get("host"),
                      "start_t": start.get("t"),
                      "steps": [r for r in recs if r.get("kind") == "step"], "end": end})
    for ev in events:  # connections: (local, peer) pairs, kept as a count and a sample
        conns = (ev.get("detail") or {}).get("connections") if isinstance(
            ev.get("detail"), dict) else None
        if conns is not None:
            ev["detail"] = {"count": len(conns), "connections": [list(x) for x in conns]}
    return {"fault": fault, "backend": backend, "nics": c.nic_count, "wall_s": wall,
            "returncodes": res.returncodes, "labels": res.labels, "timed_out": res.timed_out,
            "first_failure": res.first_failure, "killed": res.killed,
            "output_tails": {lab: out[-3000:] for lab, out in zip(res.labels, res.outputs)
                             if not res.ok},
            "events": events, "ranks": ranks}


def collect(args: argparse.Namespace) -> dict[str, Any]:
    from stragg.emucluster import EmuCluster
    from stragg.emucluster.net import parse_rate

    dropped = sorted(k for k in os.environ if k.startswith("STRAGG_"))
    for k in dropped:  # "stragg" means the defaults
        os.environ.pop(k)
    if dropped:
        eprint(f"net_faults: not passing {', '.join(dropped)} to the jobs (use --stragg-env)")
    rate_bit = parse_rate(args.rate)
    margs = model_args({k: getattr(args, k) for k in (
        "seed", "model", "vocab", "seq", "d_model", "layers", "heads", "steps", "batch")})
    model, desc = load_finetune().build_model(margs)
    params = sum(p.numel() for p in model.parameters())
    grad_bytes = 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)
    del model
    eprint(f"net_faults: {desc}, {params / 1e6:.2f} M parameters, gradient "
           f"{grad_bytes / 2**20:.2f} MiB (one bucket), {args.hosts} hosts, R = {args.rate}")
    config = {k: v for k, v in vars(args).items() if k not in ("from_json", "plot", "json")}
    doc: dict[str, Any] = {"benchmark": "net_faults", "config": config, "model": desc,
                           "params": params, "grad_bytes": grad_bytes, "rate_bit": rate_bit,
                           "goodput": GOODPUT, "jobs": []}
    n_jobs = 0
    with tempfile.TemporaryDirectory(prefix="stragg-net-faults-") as tmp:
        os.chmod(tmp, 0o755)
        for nics, faults in shape_plan(args.fault_list).items():
            eprint(f"net_faults: cluster of {args.hosts} hosts x {nics} NIC"
                   f"{'s' if nics > 1 else ''} at {rate_bit // nics / 1e6:g} Mbit/s each")
            with EmuCluster(hosts=args.hosts, rate=rate_bit // nics, nics=nics,
                            name=f"nf{os.getpid() % 100000}n{nics}") as c:
                for rep in range(args.reps):
                    k = rep % len(args.backend_list)
                    order = args.backend_list[k:] + args.backend_list[:k]
                    for fault in faults:
                        for backend in order:
                            eprint(f"  {fault}: {backend} (rep {rep + 1}/{args.reps}) ...")
                            job = run_job(c, args, fault, backend, tmp,
                                          BASE_PORT + n_jobs % 100)
                            n_jobs += 1
                            job["rep"] = rep
                            doc["jobs"].append(job)
                            s = job_summary(job, args.fault_at, args.steps)
                            eprint(f"    {s['min_steps']}/{args.steps} steps on every rank, "
                                   f"job {job['wall_s']:.0f} s"
                                   + (f"; {s['died'][0]['text']}" if s["died"] else ""))
    return doc


# --------------------------------------------------------------------------------------------
# Analysis (from the raw jobs: --from-json recomputes it)


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def rank0_steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    r0 = next((r for r in job["ranks"] if r["rank"] == 0), None)
    return r0["steps"] if r0 else []


def died(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The ranks that did not finish, earliest error first: rank, host, step it was in, text."""
    out = []
    for r in job["ranks"]:
        end = r["end"]
        if end and end.get("ok"):
            continue
        step = len(r["steps"]) + 1
        if end:
            text = f"{end.get('error_type')}: {end.get('error')}"
            t = end.get("t")
        else:
            text, t = "killed by the launcher (no error of its own)", None
            if job.get("timed_out"):
                text = "killed at the job's --timeout (no error of its own)"
        out.append({"rank": r["rank"], "host": r["host"], "step": step, "t": t,
                    "text": text, "raised": end is not None})
    out.sort(key=lambda d: (d["t"] is None, d["t"] or 0.0, d["rank"]))
    return out


def job_summary(job: dict[str, Any], fault_at: int, steps: int) -> dict[str, Any]:
    s0 = rank0_steps(job)
    times = {r["step"]: r["step_s"] for r in s0}
    counts = [len(r["steps"]) for r in job["ranks"]]
    after = [t for st, t in times.items() if st > fault_at]
    last = [times[st] for st in range(max(fault_at + 1, steps - LAST + 1), steps + 1)
            if st in times]
    ev = job["events"][0] if job["events"] else None
    out: dict[str, Any] = {
        "steps_per_rank": counts, "min_steps": min(counts, default=0),
        "completed": bool(counts) and min(counts) == steps and all(
            r["end"] and r["end"].get("ok") for r in job["ranks"]),
        "before_s": _median([times[st] for st in range(BEFORE_FROM, fault_at + 1)
                             if st in times]),
        "last_s": _median(last), "last_n": len(last),
        "stall_s": max(after) if after else None,
        "injected": ev is not None and "error" not in ev,
        "died": died(job),
    }
    if not out["completed"]:  # a dead job's steps after the fault are no "last steps"
        out["last_s"] = out["stall_s"] = None
        out["last_n"] = 0
    if out["completed"]:
        finals = [r["steps"][-1]["loss"] for r in job["ranks"]]
        out["final_loss"] = sum(finals) / len(finals)
    errors = [d["t"] for d in out["died"] if d["raised"] and d["t"] is not None]
    if ev is not None:
        out["fault_t"] = ev["t"]
        if errors:  # the first rank's error, seconds after the injection
            out["error_after_s"] = min(errors) - ev["t"]
    return out


def stragg_summary(job: dict[str, Any], fault_at: int) -> dict[str, Any]:
    """What stragg did: counters changed from step F's end to the job's end (every rank), the
    step each first changed at, the profiler's applied mode / plan checks, plans after F."""
    changed: dict[str, dict[str, Any]] = {}
    for r in job["ranks"]:
        steps = r["steps"]
        if not steps:
            continue
        before = next((s["stats"] for s in steps if s["step"] == fault_at), None)
        if before is None:
            before = steps[-1]["stats"] if steps[-1]["step"] <= fault_at else steps[0]["stats"]
        end = r["end"] or {}
        final = ((end.get("stragg") or {}).get("stats")) or steps[-1]["stats"]
        for key in sorted(set(before) | set(final)):
            if key in ROUTINE or key == "error" or before.get(key) == final.get(key):
                continue
            first = next((s["step"] for s in steps if s["step"] > fault_at
                          and s["stats"].get(key) != before.get(key)), None)
            changed.setdefault(key, {})[str(r["rank"])] = {
                "before": before.get(key), "after": final.get(key),
                "first_step": first}  # None: changed after the last finished step
    r0 = next((r for r in job["ranks"] if r["rank"] == 0), None)
    rep = ((r0 or {}).get("end") or {}).get("stragg") or {}
    prof = rep.get("profile") or {}
    plans_after = [p for st in (rep.get("plans_per_step") or [])[fault_at:] for p in st]
    counts: dict[str, int] = {}
    for p in plans_after:
        counts[p] = counts.get(p, 0) + 1
    return {
        "counters_changed": dict(sorted(changed.items(), key=lambda kv: (
            not FAULT_WORDS.search(kv[0]), kv[0]))),
        "applied": prof.get("applied"), "plan_checks": prof.get("plan_checks") or [],
        "decisions": prof.get("decisions") or [], "degraded_ranks": rep.get("degraded_ranks"),
        "plans_after": counts, "plans_per_step": rep.get("plans_per_step"),
        "profile_error": prof.get("error"), "calls_error": rep.get("calls_error"),
    }


def model_after(doc: dict[str, Any], fault: str, compute: float | None, host_rank: int | None,
                plan: str | None) -> dict[str, Any]:
    """The cost model's step after the fault (see the module docstring)."""
    cfg = doc["config"]
    n, nbytes = cfg["hosts"], doc["grad_bytes"]
    beta = 8.0 / (doc["rate_bit"] * doc["goodput"])
    slow = [host_rank] if fault == "nic-loss" and host_rank is not None and \
        cfg.get("restore_at") is None else []
    slowdown = 2.0 if slow else 1.0
    try:
        cands = candidates(n, nbytes, cfg["alpha"], beta, None, 0.0, slow, slowdown)
    except Exception as e:  # noqa: BLE001 - the model is a report, not the measurement
        return {"error": f"{type(e).__name__}: {e}"}
    best = min(cands, key=lambda k: cands[k])
    out: dict[str, Any] = {"slow_ranks": slow, "candidates_s": cands, "best": best,
                           "compute_s": compute}
    if compute is not None:
        out["ring_step_s"] = compute + cands["ring"]
        out["best_step_s"] = compute + cands[best]
    if plan and compute is not None:
        arrival, slowv = [0.0] * n, [1.0] * n
        for r in slow:
            slowv[r] = slowdown
        try:
            out["plan"] = plan
            out["plan_step_s"] = compute + simulate_plan(plan, n, nbytes, cfg["alpha"], beta,
                                                         arrival, slowv)
        except Exception as e:  # noqa: BLE001
            out["plan_error"] = f"{type(e).__name__}: {e}"
    return out


def analyse(doc: dict[str, Any]) -> None:
    cfg = doc["config"]
    F, steps = cfg["fault_at"], cfg["steps"]
    for job in doc["jobs"]:
        job["summary"] = job_summary(job, F, steps)
        if job["backend"] == "stragg":
            job["stragg_summary"] = stragg_summary(job, F)
    rows: dict[str, dict[str, Any]] = {}
    for fault in dict.fromkeys(j["fault"] for j in doc["jobs"]):
        rows[fault] = {}
        for backend in dict.fromkeys(j["backend"] for j in doc["jobs"] if j["fault"] == fault):
            mine = [j for j in doc["jobs"] if j["fault"] == fault and j["backend"] == backend]
            base = [j for j in doc["jobs"] if j["fault"] == BASELINE[NICS[fault]]
                    and j["backend"] == backend]
            sums = [j["summary"] for j in mine]
            e: dict[str, Any] = {
                "jobs": len(mine),
                "completed": sum(s["completed"] for s in sums),
                "min_steps": min(s["min_steps"] for s in sums),
                "steps_per_rank": [s["steps_per_rank"] for s in sums],
                "before_s": _median([s["before_s"] for s in sums if s["before_s"] is not None]),
                "last_s": _median([s["last_s"] for s in sums if s["last_s"] is not None]),
                "stall_s": _median([s["stall_s"] for s in sums if s["stall_s"] is not None]),
                "error_after_s": _median([s["error_after_s"] for s in sums
                                          if s.get("error_after_s") is not None]),
                "events": [j["events"] for j in mine],
                "died": [s["died"] for s in sums],
            }
            bl = [b["summary"]["final_loss"] for b in base if "final_loss" in b["summary"]]
            diffs = [abs(s["final_loss"] - bl[0]) / max(abs(bl[0]), 1e-30) for s in sums
                     if "final_loss" in s and bl]
            e["loss_rel_diff"] = max(diffs) if diffs else None
            bsteps = [t["step_s"] for b in base for t in rank0_steps(b)[BEFORE_FROM - 1:]]
            e["healthy_s"] = _median(bsteps)
            compute = _median([t["step_s"] - t["allreduce_s"] for b in base
                               for t in rank0_steps(b)[BEFORE_FROM - 1:]])
            host_rank = next((r["rank"] for r in mine[0]["ranks"] if r["host"] == cfg["host"]),
                             None)
            plan = None
            if backend == "stragg":
                e["stragg"] = [j["stragg_summary"] for j in mine]
                plans = e["stragg"][0]["plans_after"]
                plan = max(plans, key=lambda p: plans[p]) if plans else None
            else:
                plan = "ring"
            e["model"] = model_after(doc, fault, compute, host_rank, plan)
            rows[fault][backend] = e
    doc["rows"] = rows


# --------------------------------------------------------------------------------------------
# Output


def _opt(v: Any, fmt: str = "") -> str:
    return "-" if v is None else format(v, fmt)


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.3f}"


def print_tables(doc: dict[str, Any], out: Any = None) -> None:
    out = out or sys.stdout

    def say(*a: Any) -> None:
        print(*a, file=out)

    cfg, rows = doc["config"], doc["rows"]
    F, steps = cfg["fault_at"], cfg["steps"]
    backends = list(dict.fromkeys(b for r in rows.values() for b in r))
    sys.stderr.flush()
    say(f"\n== {cfg['hosts']} hosts x 1 rank, R = {cfg['rate']} per host (two-NIC shape: "
        f"R/2 per NIC), {doc['model']} {doc['params'] / 1e6:.2f} M params, gradient "
        f"{doc['grad_bytes'] / 2**20:.2f} MiB, {steps} steps, fault after step {F} of rank 0, "
        f"pg timeout {cfg['pg_timeout']:g} s, reps {cfg['reps']}")
    say(f"done: steps every rank finished / {steps} (jobs that completed of jobs); died: s "
        f"from the fault to the first rank's error; step time (s, rank 0): before = median of "
        f"steps {BEFORE_FROM}..{F}, last = median of the last {LAST} steps after the fault, "
        "stall = the longest step after it (jobs that completed); loss = final loss vs the "
        "same backend's fault-free job (relative)")
    head = f"{'fault':<13}"
    for b in backends:
        head += (f" | {b + ': done':<14} {'died':>5} {'before':>6} {'last':>6} {'stall':>6} "
                 f"{'loss':>7}")
    head += f" | {'last/healthy':>12}"
    if "gloo" in backends and "stragg" in backends:
        head += f" {'gloo/stragg':>11}"
    say(head)
    for fault, r in rows.items():
        line = f"{fault:<13}"
        for b in backends:
            e = r.get(b)
            if e is None:
                line += f" | {'':<14} {'':>5} {'':>6} {'':>6} {'':>6} {'':>7}"
                continue
            done = f"{e['min_steps']} ({e['completed']}/{e['jobs']})"
            line += (f" | {done:<14} {_opt(e['error_after_s'], '.1f'):>5} "
                     f"{_opt(e['before_s'], '.3f'):>6} "
                     f"{_opt(e['last_s'], '.3f'):>6} {_opt(e['stall_s'], '.2f'):>6} "
                     f"{_opt(e['loss_rel_diff'], '.1e'):>7}")
        ratios = ", ".join(_ratio(r[b]["last_s"], r[b]["healthy_s"]) for b in backends
                           if b in r)
        line += f" | {ratios:>12}"
        if "gloo" in r and "stragg" in r:
            line += f" {_ratio(r['gloo']['last_s'], r['stragg']['last_s']):>11}"
        say(line)
    h1, h2 = rows.get("healthy-1nic", {}), rows.get("healthy-2nic", {})
    for b in backends:
        if b in h1 and b in h2:
            say(f"two NICs at R/2 vs one at R, {b}: healthy-2nic / healthy-1nic step "
                f"{_ratio(h2[b]['last_s'], h1[b]['last_s'])} (done when <= 1.15)")

    say("\nthe faults, and what ended the jobs (per job: the ranks that did not finish, "
        "earliest error first; step = the step it was in):")
    port_re = re.compile(r":(\d+)$")
    for fault, r in rows.items():
        for b, e in r.items():
            for rep, (ds, evs) in enumerate(zip(e["died"], e["events"])):
                tag = f"  {fault:<13} {b:<7}" + (f" rep {rep + 1}" if e["jobs"] > 1 else "")
                for ev in evs:
                    what = f"after step {ev['rank0_steps']} of rank 0: {ev['what']}"
                    det = ev.get("detail") or {}
                    if isinstance(det, dict) and "count" in det:
                        ports = [int(m.group(1)) for pair in det["connections"] for a in pair
                                 if (m := port_re.search(a))]
                        what += f": {det['count']} connections"
                        if ev.get("store_port") in ports:
                            what += " (the TCPStore's among them)"
                    if ev.get("error"):
                        what += f": FAILED {ev['error']}"
                    say(f"{tag} {what}")
                    tag = " " * len(tag)
                if not ds:
                    continue
                say(f"{tag} steps finished per rank: {e['steps_per_rank'][rep]}")
                for d in ds:
                    text = d["text"].split(" This is typically caused by")[0]  # Gloo's advice
                    say(f"{tag} rank {d['rank']} (host {d['host']}), step {d['step']}: "
                        f"{text[:300]}")
                    tag = " " * len(tag)

    say(f"\ncost model after the fault (alpha {cfg['alpha'] * 1e6:g} us, beta = 8/(R*"
        f"{doc['goodput']}); step = the fault-free job's compute + simulated all_reduce; the "
        "two-NIC shape as one link of R per host): measured last / predicted (s)")
    for fault, r in rows.items():
        for b, e in r.items():
            m = e["model"]
            if "error" in m:
                say(f"  {fault:<13} {b:<7} model: {m['error']}")
                continue
            slow = f"rank {m['slow_ranks'][0]} at R/2" if m["slow_ranks"] else "every host at R"
            say(f"  {fault:<13} {b:<7} {_opt(e['last_s'], '.3f')} / ran {m.get('plan') or '-'}: "
                f"{_opt(m.get('plan_step_s'), '.3f')}; Ring {_opt(m.get('ring_step_s'), '.3f')}; "
                f"best {m['best']}: {_opt(m.get('best_step_s'), '.3f')} ({slow})")

    say(f"\nwhat stragg did (its first job of each fault; counters: rank: before -> after "
        f"(first changed at step), from the end of step {F} to the end):")
    for fault, r in rows.items():
        e = r.get("stragg")
        if not e:
            continue
        s = e["stragg"][0]
        plans = ", ".join(f"{p} x{c}" for p, c in s["plans_after"].items()) or "-"
        applied = s.get("applied") or {}
        say(f"  {fault:<13} plans after step {F}: {plans}; applied: mode "
            f"{applied.get('mode', '-')}, straggler {_opt(applied.get('straggler'))}, "
            f"degraded {applied.get('degraded') or '-'}; plan checks: {len(s['plan_checks'])}")
        for pc in s["plan_checks"][-4:]:
            say(f"  {'':<13}   plan check at call {pc.get('call')}: {pc.get('change')} -> "
                f"kept {pc.get('kept')}, chosen {pc.get('chosen')}")
        for key, per_rank in s["counters_changed"].items():
            cells = "; ".join(f"{rk}: {v['before']} -> {v['after']}"
                              + (f" (step {v['first_step']})" if v["first_step"] else "")
                              for rk, v in per_rank.items())
            say(f"  {'':<13}   {key}: {cells}")
        if not s["counters_changed"]:
            say(f"  {'':<13}   no counter beyond the routine ones changed")
        for what in ("profile_error", "calls_error"):
            if s.get(what):
                say(f"  {'':<13}   {what}: {s[what]}")
    out.flush()


def plot(doc: dict[str, Any], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg, rows = doc["config"], doc["rows"]
    F, steps = cfg["fault_at"], cfg["steps"]
    faults = list(rows)
    ncols = min(3, len(faults))
    nrows = (len(faults) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.6 * nrows), squeeze=False)
    for ax, fault in zip(axes.flat, faults):
        for job in (j for j in doc["jobs"] if j["fault"] == fault):
            b = job["backend"]
            s0 = rank0_steps(job)
            first = job["rep"] == 0
            e = rows[fault][b]
            tail = (f"last {e['last_s']:.3f} s" if e["last_s"] is not None else
                    f"died {_opt(e['error_after_s'], '.0f')} s after the fault")
            label = f"{b}: {e['min_steps']}/{steps} steps, {tail}" if first else None
            xs, ys = [t["step"] for t in s0], [t["step_s"] for t in s0]
            ax.plot(xs, ys, color=COLORS.get(b, "tab:purple"), lw=1.3 if first else 0.7,
                    alpha=1.0 if first else 0.4, label=label)
            if not job["summary"]["completed"] and xs:
                ax.plot([xs[-1]], [ys[-1]], "x", color=COLORS.get(b, "tab:purple"), ms=8)
        if fault not in BASELINE.values():
            for b in rows[fault]:  # the same backend's fault-free job, dotted
                base = next((j for j in doc["jobs"] if j["fault"] == BASELINE[NICS[fault]]
                             and j["backend"] == b), None)
                if base is not None:
                    s0 = rank0_steps(base)
                    ax.plot([t["step"] for t in s0], [t["step_s"] for t in s0], ls=":", lw=1,
                            color=COLORS.get(b, "tab:purple"),
                            label=f"{b}, {BASELINE[NICS[fault]]}")
            ax.axvline(F + 0.5, color="tab:red", ls="--", lw=1, label=f"fault after step {F}")
            if fault == "nic-loss" and cfg.get("restore_at"):
                ax.axvline(cfg["restore_at"] + 0.5, color="tab:green", ls="--", lw=1,
                           label=f"NIC back after step {cfg['restore_at']}")
        ax.set_title(fault, fontsize="medium")
        ax.set_xlabel("step")
        ax.set_ylabel("step time (s, rank 0)")
        ax.set_xlim(0.5, steps + 0.5)
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="x-small", loc="upper left")
    for ax in list(axes.flat)[len(faults):]:
        ax.set_visible(False)
    fig.suptitle(f"DDP training under network faults, {cfg['hosts']} emulated hosts, "
                 f"{doc['model']} ({doc['grad_bytes'] / 2**20:.1f} MiB gradient), R = "
                 f"{cfg['rate']}; x: the job died", fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        doc = json.loads(Path(args.from_json).read_text().strip().splitlines()[-1])
        analyse(doc)
        print_tables(doc)
        if args.plot:
            eprint(f"figure: {plot(doc, args.plot)}")
        return 0
    from stragg.emucluster import EmuClusterError

    try:
        doc = collect(args)
    except EmuClusterError as e:
        eprint(f"net_faults: emulated cluster: {e}")
        return 1
    analyse(doc)
    print_tables(doc, sys.stderr if args.json else sys.stdout)
    if args.plot:
        doc["plot"] = plot(doc, args.plot)
        eprint(f"figure: {doc['plot']}")
    if args.json:
        print(json.dumps(doc), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
