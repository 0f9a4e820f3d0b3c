"""DDP training across emulated hosts: Gloo vs stragg with a late rank, a slow NIC, or both.

    sudo .venv/bin/python benchmarks/training.py --hosts 8 --rate 300mbit
    sudo .venv/bin/python benchmarks/training.py --hosts 4 --scenarios late,nic --reps 3 \\
        --json --plot training.png > training.json
    .venv/bin/python benchmarks/training.py --from-json training.json --plot training.png

What it measures: the step time of plain DistributedDataParallel training (the demo's GPT-2 from
examples/finetune.py: random weights, a synthetic Markov-chain token language, AdamW, one
gradient bucket = one all_reduce per step) on P emulated hosts (stragg.emucluster: network
namespaces on a bridge, every host's link shaped to --rate with tc), one rank per host
(--nproc-per-node K for more), launched on every host with torchrun exactly as a multi-node job.
For each P in --hosts one cluster is built, and every scenario runs every backend as a fresh
torchrun job (fresh processes: stragg's profiler starts from nothing):

  healthy    every link at --rate, nobody late
  late       the rank on host L (default P-1) is D late for every gradient all_reduce: it waits
             D when its gradient is ready, before its all_reduce (--late-at allreduce: a DDP
             comm hook, on every rank torch's allreduce_hook) or between its forward and
             backward pass (--late-at backward); --straggler-mode sleep (default: each emulated
             host would have its own CPU) or busy
  nic        host H's link (default P-3) at rate/l (l = --slowdown, default 2)
  both       the late rank on host L and the slow link on host H != L
  both-same  the late rank and the slow link on the same host (H = L)

Backends (--backends): gloo (init_process_group("gloo")); stragg-ring (stragg, STRAGG_ALGO=ring:
stragg's transport without straggler or degraded-link handling); stragg (stragg with its
defaults: no STRAGG_* setting; inherited STRAGG_* variables are dropped, --stragg-env sets some).
Per job: rank 0's wall time of every step; the summary is over the last --tail steps (median,
IQR, min-max); with --reps N every (scenario, backend) job runs N times, interleaved (backend
order rotated per repetition), and the table shows the median of the per-job medians (spread:
pooled tail samples). D defaults to the hosts' Ring reduce-scatter time of the gradient on the
healthy network, (P-1)/P * S * beta (P hosts, S gradient bytes, beta = 8 / (rate * 0.956): htb
carries 1448 payload bytes per 1514-byte frame, as benchmarks/degraded.py); --delay-ms
overrides it.

Cost model (printed beside the measurements): predicted step = compute + T, where T is the
all_reduce simulated by stragg.sim.simulate (lockstep alpha-beta model, alpha = --alpha per
round, beta as above) from the moment the on-time ranks arrive, with the late rank arriving D
later (arrival=) and the slow host's ranks at slowdown l (slowdown=): T includes whatever part of
D the algorithm cannot hide. compute = the median over the tail steps of (step time - all_reduce
time) on rank 0 in the healthy Gloo job (all_reduce time: from the last gradient accumulated,
seen by a post-accumulate-grad hook, to the end of backward(), where DDP waits for its one
bucket); without a healthy Gloo job, the median over all Gloo jobs of the cluster (minus D where
rank 0 is late). Gloo and stragg-ring are modelled as Ring; stragg as the plan it ran in most
tail steps ("ring", "rhd", "stragglar(7)", "optcc(5=2,k=64)", "host:stragglar_direct(6,k=8)",
...), and "(model)" beside each measured ratio is the same ratio of the predicted steps. The
model's best candidate is the fastest of Ring, StragglAR and StragglAR-direct for the late rank
and OptCC for the slow host's ranks (k from 1..128), with --nproc-per-node K > 1 also their
host-level plans and the host-level Ring; ceiling = predicted Ring step / predicted best step.
With K > 1 the model is two-level: the ranks of a host share its NIC (every rank of the slow host
gets the factor l), host mates talk over shared memory (alpha 10 us, 3 GB/s). Ranks are taken
from the jobs (torchrun's rendezvous numbers the hosts by address string, so host i holds rank
i only up to 9 hosts).

Also reported: what stragg decided (plans of the tail steps, the call and step at which it first
ran StragglAR and OptCC, the degraded ranks its link probes found, the profiler's straggler), the
largest relative difference of every backend's loss curve (mean over ranks) from Gloo's over the
whole run, and stragg's longest step (warm-up included) over its median tail step.

--json: one JSON object (configuration, every job's per-step, per-rank times and stragg records,
the summaries) as the last stdout line; progress goes to stderr. --plot F.png: per (P, scenario)
a panel of step time vs step per backend, the model's predicted steps dotted, and where stragg
first ran StragglAR / OptCC. --from-json F[,G] redraws table and plot without running (--tail
and --alpha may be changed). Needs root (network namespaces); the cluster (named trn<pid>) is
torn down whatever happens; a failed or timed-out job (--timeout, per job) prints its output tail
and the benchmark exits 1.
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
from collections import Counter
from pathlib import Path
from typing import Any

from _common import Stats, eprint
from _training_worker import load_finetune, model_args, step_of_call

HERE = Path(__file__).resolve().parent
WORKER = HERE / "_training_worker.py"
GOODPUT = 0.956  # payload share of htb's shaped rate (1448 of 1514 bytes per frame)
SCENARIOS = ("healthy", "late", "nic", "both", "both-same")
BACKENDS = ("gloo", "stragg-ring", "stragg")
OPTCC_SEGMENTS = (1, 2, 4, 8, 16, 32, 64, 128)  # the planner's candidates
# Host mates' shared memory in the two-level model (--nproc-per-node > 1): the planner's defaults.
LOCAL_ALPHA = 10e-6
LOCAL_BETA = 1 / 3e9
COLORS = {"gloo": "tab:blue", "stragg-ring": "tab:green", "stragg": "tab:orange"}
BASE_PORT = 29500


class JobFailed(RuntimeError):
    """A torchrun job exited non-zero, timed out or wrote no result."""


# --------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog="See the module docstring (benchmarks/training.py) for what is measured.",
    )
    p.add_argument("--hosts", default="8", help="comma list of emulated host counts (default 8)")
    p.add_argument("--nproc-per-node", type=int, default=1, help="ranks per host (default 1)")
    p.add_argument("--rate", default="300mbit", help="every host's link rate (tc units)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS),
                   help=f"comma list of {', '.join(SCENARIOS)} (default all)")
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help=f"comma list of {', '.join(BACKENDS)} (default all)")
    p.add_argument("--steps", type=int, default=60, help="training steps per job (default 60)")
    p.add_argument("--tail", type=int, default=20,
                   help="summarise the last TAIL steps of each job (default 20)")
    p.add_argument("--reps", type=int, default=1,
                   help="jobs per (scenario, backend), interleaved (default 1)")
    p.add_argument("--late-host", type=int, default=None,
                   help="host of the late rank (its local rank 0); negative: from the end "
                   "(default P-1)")
    p.add_argument("--slow-host", type=int, default=None,
                   help="host with the slow link in 'nic' and 'both'; negative: from the end "
                   "(default P-3, at least 0)")
    p.add_argument("--slowdown", type=float, default=2.0,
                   help="the slow host's link runs at rate/SLOWDOWN (default 2)")
    p.add_argument("--delay-ms", type=float, default=None,
                   help="the late rank's delay D per step (default: Ring's reduce-scatter time "
                   "of the gradient on the healthy network)")
    p.add_argument("--straggler-mode", choices=("sleep", "busy"), default="sleep",
                   help="how the late rank spends D: sleep (default) or spin")
    p.add_argument("--late-at", choices=("allreduce", "backward"), default="allreduce",
                   help="where the late rank waits D: at its all_reduce (default; every rank "
                   "runs DDP with torch's allreduce comm hook) or before its backward pass (its "
                   "backward then runs on cores the others left idle: it arrives less than D "
                   "late on a machine whose hosts share cores)")
    p.add_argument("--slow-start-after-idle", action="store_true",
                   help="keep the kernel's net.ipv4.tcp_slow_start_after_idle = 1 on the emulated "
                   "hosts (default 0, as clusters tuned for training run)")
    p.add_argument("--alpha", type=float, default=50e-6,
                   help="the cost model's latency per round, s (default 50e-6)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="limit per job and collective timeout, s (default 600)")
    p.add_argument("--stragg-env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment for the stragg-* jobs (repeatable)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object as the last stdout line (progress on stderr)")
    p.add_argument("--plot", default="", help="write a PNG: step time vs step per scenario")
    p.add_argument("--from-json", default="", metavar="A.json[,B.json]",
                   help="no run: table (and --plot) from earlier --json outputs")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="stream the jobs' output to stderr")
    g = p.add_argument_group("model and data (examples/finetune.py's GPT-2)")
    g.add_argument("--layers", type=int, default=2)
    g.add_argument("--d-model", type=int, default=256)
    g.add_argument("--heads", type=int, default=4)
    g.add_argument("--vocab", type=int, default=2048)
    g.add_argument("--seq", type=int, default=16, help="tokens per sequence (default 16)")
    g.add_argument("--batch", type=int, default=1, help="sequences per rank per step (default 1)")
    g.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--model", choices=("auto", "gpt2", "torch"), default="auto",
                   help="auto: transformers' GPT-2 when importable, else finetune's TinyCausalLM")
    args = p.parse_args(argv)
    if args.from_json:
        return args
    try:
        args.host_list = [int(x) for x in args.hosts.split(",") if x.strip()]
    except ValueError:
        p.error(f"--hosts: expected a comma list of integers, got {args.hosts!r}")
    if not args.host_list or min(args.host_list) < 2:
        p.error("--hosts: every host count must be at least 2")
    args.scenario_list = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    args.backend_list = [b.strip() for b in args.backends.split(",") if b.strip()]
    for name, got, allowed in (("--scenarios", args.scenario_list, SCENARIOS),
                               ("--backends", args.backend_list, BACKENDS)):
        bad = [x for x in got if x not in allowed]
        if bad or not got:
            p.error(f"{name}: {', '.join(bad) or 'empty'}; choose from {', '.join(allowed)}")
    if args.steps < 1 or not 1 <= args.tail <= args.steps:
        p.error("need --steps >= 1 and 1 <= --tail <= --steps")
    if args.reps < 1 or args.nproc_per_node < 1 or args.slowdown < 1:
        p.error("need --reps >= 1, --nproc-per-node >= 1, --slowdown >= 1")
    if args.delay_ms is not None and args.delay_ms < 0:
        p.error("--delay-ms must be >= 0")
    if args.seq < 2:
        p.error("--seq must be at least 2 (the model predicts each sequence's next tokens)")
    for item in args.stragg_env:
        if "=" not in item:
            p.error(f"--stragg-env {item!r}: expected KEY=VALUE")
    for hosts in args.host_list:
        for s in args.scenario_list:
            try:
                scenario_hosts(s, hosts, args)
            except ValueError as e:
                p.error(str(e))
    return args


def _resolve_host(value: int | None, default: int, hosts: int, what: str) -> int:
    if value is None:
        return default
    h = value + hosts if value < 0 else value
    if not 0 <= h < hosts:
        raise ValueError(f"{what} {value} is not a host of {hosts}")
    return h


def scenario_hosts(name: str, hosts: int, args: argparse.Namespace) -> tuple[int | None,
                                                                             int | None]:
    """(late host, slow host) of a scenario on `hosts` hosts."""
    late = _resolve_host(args.late_host, hosts - 1, hosts, "--late-host")
    slow = _resolve_host(args.slow_host, max(0, hosts - 3), hosts, "--slow-host")
    if name == "healthy":
        return None, None
    if name == "late":
        return late, None
    if name == "nic":
        return None, slow
    if name == "both":
        if slow == late:
            raise ValueError(f"scenario 'both' needs the slow host ({slow}) to differ from the "
                             f"late host ({late}); 'both-same' puts them together")
        return late, slow
    return late, late  # both-same


# --------------------------------------------------------------------------------------------
# Running the jobs


def model_size(args: argparse.Namespace) -> tuple[int, int, str]:
    """(parameters, gradient bytes, description) of the demo's model with these options."""
    cfg = {k: getattr(args, k) for k in ("seed", "model", "vocab", "seq", "d_model", "layers",
                                          "heads", "steps", "batch")}
    model, desc = load_finetune().build_model(model_args(cfg))
    params = sum(p.numel() for p in model.parameters())
    grad = 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)
    return params, grad, desc


def job_env(args: argparse.Namespace, backend: str, cfg: dict[str, Any]) -> dict[str, str]:
    env = {"TRAINING_BENCH_CONFIG": json.dumps(cfg), "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    if backend.startswith("stragg"):
        for item in args.stragg_env:
            key, _, value = item.partition("=")
            env[key.strip()] = value
    if backend == "stragg-ring":
        env["STRAGG_ALGO"] = "ring"
    return env


def run_job(c: Any, args: argparse.Namespace, cfg: dict[str, Any], port: int) -> dict[str, Any]:
    """One torchrun job on every host; returns rank 0's result (raises JobFailed)."""
    env = job_env(args, cfg["backend"], cfg)
    if os.path.exists(cfg["result"]):
        os.remove(cfg["result"])
    t0 = time.perf_counter()
    res = c.run([str(WORKER)], torchrun=True, nproc_per_node=args.nproc_per_node, env=env,
                timeout=args.timeout, master_port=port,
                output=sys.stderr if args.verbose else None)
    wall = time.perf_counter() - t0
    if not res.ok or not os.path.exists(cfg["result"]):
        why = "timed out" if res.timed_out else f"exit {res.worst}"
        if res.ok:
            why = "no result file"
        raise JobFailed(f"the {cfg['backend']} job ({cfg['scenario']}, {c.size} hosts) failed "
                        f"({why}, first failure {res.first_failure}) after {wall:.0f} s; "
                        f"output tails:\n{res.describe()}")
    with open(cfg["result"]) as f:
        out = json.load(f)
    out["wall_s"] = wall
    return out


def collect(args: argparse.Namespace) -> dict[str, Any]:
    from stragg.emucluster.net import parse_rate
    from stragg.emucluster import EmuCluster

    dropped = sorted(k for k in os.environ if k.startswith("STRAGG_"))
    for k in dropped:  # "stragg" means the defaults
        os.environ.pop(k)
    if dropped:
        eprint(f"training: not passing {', '.join(dropped)} to the jobs (use --stragg-env)")
    rate_bit = parse_rate(args.rate)
    beta = 8.0 / (rate_bit * GOODPUT)
    params, grad_bytes, desc = model_size(args)
    eprint(f"training: {desc}, {params / 1e6:.2f} M parameters, gradient "
           f"{grad_bytes / 2**20:.2f} MiB (one bucket)")
    config = {k: v for k, v in vars(args).items() if k not in ("from_json", "plot", "json")}
    doc: dict[str, Any] = {"benchmark": "training", "config": config, "model": desc,
                           "params": params, "grad_bytes": grad_bytes, "rate_bit": rate_bit,
                           "goodput": GOODPUT, "beta_s_per_byte": beta, "clusters": []}
    jobs_done = 0
    with tempfile.TemporaryDirectory(prefix="stragg-training-") as tmp:
        os.chmod(tmp, 0o755)
        for hosts in args.host_list:
            world = hosts * args.nproc_per_node
            delay = (args.delay_ms / 1e3 if args.delay_ms is not None
                     else (hosts - 1) / hosts * grad_bytes * beta)
            cluster: dict[str, Any] = {"hosts": hosts, "world": world, "delay_s": delay,
                                       "scenarios": []}
            doc["clusters"].append(cluster)
            eprint(f"training: {hosts} hosts x {args.nproc_per_node} at {args.rate}, "
                   f"D = {delay * 1e3:.1f} ms")
            with EmuCluster(hosts=hosts, rate=args.rate, name=f"trn{os.getpid()}",
                            slow_start_after_idle=args.slow_start_after_idle) as c:
                for name in args.scenario_list:
                    late, slow = scenario_hosts(name, hosts, args)
                    sc: dict[str, Any] = {"name": name, "late_host": late, "slow_host": slow,
                                          "slowdown": args.slowdown if slow is not None else 1.0,
                                          "jobs": []}
                    cluster["scenarios"].append(sc)
                    if slow is not None:
                        c.degrade(slow, args.slowdown)
                    try:
                        for rep in range(args.reps):
                            k = rep % len(args.backend_list)
                            for backend in args.backend_list[k:] + args.backend_list[:k]:
                                cfg = job_config(args, backend, name, late, slow, delay,
                                                 os.path.join(tmp, f"job{jobs_done}.json"))
                                eprint(f"  [{hosts} hosts] {name}: {backend} "
                                       f"(rep {rep + 1}/{args.reps}) ...")
                                out = run_job(c, args, cfg, BASE_PORT + jobs_done % 100)
                                jobs_done += 1
                                out["rep"] = rep
                                sc["jobs"].append(out)
                                med = statistics.median(out["per_rank"][0]["step_s"][-args.tail:])
                                eprint(f"    median step {med:.3f} s, job {out['wall_s']:.0f} s")
                    finally:
                        if slow is not None:
                            c.degrade(slow, 1.0)
    return doc


def job_config(args: argparse.Namespace, backend: str, scenario: str, late: int | None,
               slow: int | None, delay: float, result: str) -> dict[str, Any]:
    return {
        "backend": backend, "scenario": scenario, "late_host": late, "slow_host": slow,
        "delay_s": delay if late is not None else 0.0, "straggler_mode": args.straggler_mode,
        "late_at": args.late_at,
        "steps": args.steps, "seed": args.seed, "model": args.model, "vocab": args.vocab,
        "seq": args.seq, "d_model": args.d_model, "layers": args.layers, "heads": args.heads,
        "batch": args.batch, "lr": args.lr, "timeout_s": args.timeout, "result": result,
        "progress_every": 10 if args.verbose else 0,
    }


# --------------------------------------------------------------------------------------------
# Cost model


def parse_plan(plan: str) -> tuple[str, dict[str, Any]]:
    """"stragglar(7)" -> ("stragglar", {"straggler": 7}); "optcc(5=2,7=1.5,k=64)" ->
    ("optcc", {"stragglers": [5, 7], "slowdowns": [2.0, 1.5], "segments": 64});
    "stragglar_direct(7,k=32)" -> ("stragglar_direct", {"straggler": 7, "segments": 32});
    "ring" -> ("ring", {}); "host:ring" -> ("host_level", {"cross": "ring"}) (the host-level
    plan; its hosts are added by simulate_plan)."""
    if plan.strip().startswith("host:"):
        algo, kw = parse_plan(plan.strip()[len("host:"):])
        return "host_level", {"cross": algo, **kw}
    m = re.fullmatch(r"\s*([A-Za-z_]+)\s*(?:\((.*)\))?\s*", plan)
    if not m:
        raise ValueError(f"unknown plan {plan!r}")
    algo, params = m.group(1), (m.group(2) or "").strip()
    if algo == "optcc":
        pairs = re.findall(r"(\d+)\s*=\s*([\d.]+)", params)
        kw: dict[str, Any] = {"stragglers": [int(r) for r, _ in pairs],
                              "slowdowns": [float(f) for _, f in pairs]}
        k = re.search(r"k\s*=\s*(\d+)", params)
        if k:
            kw["segments"] = int(k.group(1))
        return algo, kw
    m = re.fullmatch(r"(\d+)(?:\s*,\s*k\s*=\s*(\d+))?", params)
    if m:
        kw = {"straggler": int(m.group(1))}
        if m.group(2):
            kw["segments"] = int(m.group(2))
        return algo, kw
    return algo, {}


def two_level(host_of: list[int] | None) -> bool:
    """Whether ranks share hosts among several (the two-level model applies)."""
    return bool(host_of) and len(set(host_of)) > 1 and len(set(host_of)) < len(host_of)


def simulate_plan(plan: str, n: int, nbytes: int, alpha: float, beta: float,
                  arrival: list[float], slowdown: list[float],
                  host_of: list[int] | None = None) -> float:
    """The all_reduce time of `plan` on n ranks, from the on-time ranks' arrival; with ranks
    sharing hosts, in the two-level model (a host's ranks share its NIC, host mates talk over
    shared memory at LOCAL_ALPHA / LOCAL_BETA)."""
    from stragg import schedule, sim

    algo, kw = parse_plan(plan)
    if algo == "host_level":
        kw["hosts"] = list(host_of or range(n))
    s = schedule.build(algo, n, **kw)
    levels: dict[str, Any] = {}
    if two_level(host_of):
        levels = {"host_of": host_of, "local_alpha": LOCAL_ALPHA, "local_beta": LOCAL_BETA}
    return sim.simulate(s, nbytes=nbytes, alpha=alpha, beta=beta, arrival=arrival,
                        slowdown=slowdown, **levels).time


def network(n: int, late_rank: int | None, delay: float, slow_ranks: list[int],
            slowdown: float) -> tuple[list[float], list[float]]:
    arrival = [0.0] * n
    if late_rank is not None:
        arrival[late_rank] = delay
    slow = [1.0] * n
    for r in slow_ranks:
        slow[r] = slowdown
    return arrival, slow


def candidates(n: int, nbytes: int, alpha: float, beta: float, late_rank: int | None,
               delay: float, slow_ranks: list[int], slowdown: float,
               host_of: list[int] | None = None) -> dict[str, float]:
    """Predicted all_reduce time of Ring, StragglAR(late rank), StragglAR-direct(late rank;
    fastest k), OptCC(slow ranks; fastest k), and with ranks sharing hosts the host-level Ring,
    StragglAR-direct and OptCC."""
    arrival, slow = network(n, late_rank, delay, slow_ranks, slowdown)

    def sim(plan: str) -> float:
        return simulate_plan(plan, n, nbytes, alpha, beta, arrival, slow, host_of)

    out = {"ring": sim("ring")}
    prefixes = ["", "host:"] if two_level(host_of) else [""]

    def fastest(plans: list[str]) -> None:
        best: tuple[float, str] | None = None
        for plan in plans:
            try:
                t = sim(plan)
            except Exception:  # noqa: BLE001 - a generator that cannot serve n is no candidate
                continue
            if best is None or t < best[0]:
                best = (t, plan)
        if best is not None:
            out[best[1]] = best[0]

    if two_level(host_of):
        out["host:ring"] = sim("host:ring")
    if late_rank is not None:
        try:
            out[f"stragglar({late_rank})"] = sim(f"stragglar({late_rank})")
        except Exception as e:  # noqa: BLE001 - a generator that cannot serve n is no candidate
            eprint(f"training: no StragglAR candidate for n={n}: {e}")
        for pre in prefixes:
            fastest([f"{pre}stragglar_direct({late_rank},k={k})" for k in OPTCC_SEGMENTS])
    if slow_ranks and slowdown > 1:
        spec = ",".join(f"{r}={slowdown:g}" for r in slow_ranks)
        for pre in prefixes:
            fastest([f"{pre}optcc({spec},k={k})" for k in OPTCC_SEGMENTS])
    return out


# --------------------------------------------------------------------------------------------
# Analysis (from the raw jobs: --from-json recomputes it)


def rank0(job: dict[str, Any], part: str) -> list[float]:
    return list(job["per_rank"][0][part])


def job_summary(job: dict[str, Any], tail: int) -> dict[str, Any]:
    steps = rank0(job, "step_s")
    ar = rank0(job, "allreduce_s")
    late0 = rank0(job, "late_s")
    compute = [s - a - d for s, a, d in zip(steps, ar, late0)]
    st = Stats.of(steps[-tail:])
    out: dict[str, Any] = {
        "median_s": st.median, "p25_s": st.p25, "p75_s": st.p75, "min_s": st.minimum,
        "max_s": st.maximum, "allreduce_s": statistics.median(ar[-tail:]),
        "compute_s": statistics.median(compute[-tail:]),
        "longest_s": max(steps), "longest_step": steps.index(max(steps)) + 1,
        "longest_over_median": max(steps) / st.median,
    }
    rep = job.get("stragg")
    if rep:
        tail_plans = [p for plans in rep["plans_per_step"][-tail:] for p in plans]
        out["tail_plans"] = dict(Counter(tail_plans))
        out["plan"] = Counter(tail_plans).most_common(1)[0][0] if tail_plans else None
        out["first_stragglar"] = rep.get("first_stragglar")
        out["first_optcc"] = rep.get("first_optcc")
        out["degraded_ranks"] = rep.get("degraded_ranks") or {}
        prof = rep.get("profile") or {}
        out["profile_straggler"] = prof.get("straggler")
        out["decisions"] = prof.get("decisions") or []
        preds = [c["predicted_s"] for c in rep["calls"]
                 if c.get("step") is not None and c["step"] >= job["steps"] - tail
                 and c.get("plan") == out["plan"] and c.get("predicted_s")]
        out["planner_predicted_s"] = statistics.median(preds) if preds else None
    return out


def rel_diff(a: list[float], b: list[float]) -> float:
    return max((abs(x - y) / max(abs(y), 1e-30) for x, y in zip(a, b)), default=0.0)


def analyse(doc: dict[str, Any], tail: int, alpha: float) -> None:
    """Fills every cluster's and scenario's summary from the raw jobs."""
    beta = doc["beta_s_per_byte"]
    nbytes = doc["grad_bytes"]
    doc["analysis"] = {"tail": tail, "alpha_s": alpha}
    for cl in doc["clusters"]:
        cl["scenarios"] = [sc for sc in cl["scenarios"] if sc["jobs"]]  # an interrupted run
        if not cl["scenarios"]:
            continue
        for sc in cl["scenarios"]:
            for job in sc["jobs"]:
                job["summary"] = job_summary(job, tail)
        gloo_healthy = [j["summary"]["compute_s"] for sc in cl["scenarios"] if sc["name"] ==
                        "healthy" for j in sc["jobs"] if j["backend"] == "gloo"]
        gloo_any = [j["summary"]["compute_s"] for sc in cl["scenarios"] for j in sc["jobs"]
                    if j["backend"] == "gloo"]
        every = [j["summary"]["compute_s"] for sc in cl["scenarios"] for j in sc["jobs"]]
        if gloo_healthy:
            cl["compute_s"], cl["compute_source"] = statistics.median(gloo_healthy), "healthy gloo"
        elif gloo_any:
            cl["compute_s"], cl["compute_source"] = statistics.median(gloo_any), "all gloo jobs"
        else:
            cl["compute_s"], cl["compute_source"] = statistics.median(every), "all jobs"
        cl["compute_by_backend"] = {
            b: statistics.median(j["summary"]["compute_s"] for sc in cl["scenarios"]
                                 for j in sc["jobs"] if j["backend"] == b)
            for b in dict.fromkeys(j["backend"] for sc in cl["scenarios"] for j in sc["jobs"])
        }
        for sc in cl["scenarios"]:
            analyse_scenario(cl, sc, tail, nbytes, alpha, beta)


def analyse_scenario(cl: dict[str, Any], sc: dict[str, Any], tail: int, nbytes: int,
                     alpha: float, beta: float) -> None:
    jobs = sc["jobs"]
    first = jobs[0]
    n = first["world"]
    late_rank = first["late_rank"]
    slow_ranks = first["slow_ranks"] if sc["slow_host"] is not None else []
    delay = first["delay_s"]
    compute = cl["compute_s"]
    arrival, slow = network(n, late_rank, delay, slow_ranks, sc["slowdown"])
    host_of = first.get("host_of_rank")
    gloo_by_rep = {j["rep"]: j for j in jobs if j["backend"] == "gloo"}
    backends: dict[str, Any] = {}
    for b in dict.fromkeys(j["backend"] for j in jobs):
        mine = [j for j in jobs if j["backend"] == b]
        pooled = [t for j in mine for t in rank0(j, "step_s")[-tail:]]
        st = Stats.of(pooled)
        entry: dict[str, Any] = {
            "median_s": statistics.median(j["summary"]["median_s"] for j in mine),
            "job_medians_s": [j["summary"]["median_s"] for j in mine],
            "iqr_s": st.p75 - st.p25, "min_s": st.minimum, "max_s": st.maximum,
            "allreduce_s": statistics.median(j["summary"]["allreduce_s"] for j in mine),
            "longest_over_median": max(j["summary"]["longest_over_median"] for j in mine),
        }
        diffs = [rel_diff(j["losses"], gloo_by_rep[j["rep"]]["losses"]) for j in mine
                 if j["rep"] in gloo_by_rep]
        entry["loss_rel_diff"] = max(diffs) if diffs else None
        plan = "ring" if b in ("gloo", "stragg-ring") else mine[0]["summary"].get("plan")
        entry["model_plan"] = plan
        if plan:
            try:
                entry["model_allreduce_s"] = simulate_plan(plan, n, nbytes, alpha, beta,
                                                           arrival, slow, host_of)
                entry["model_step_s"] = compute + entry["model_allreduce_s"]
            except Exception as e:  # noqa: BLE001 - an unknown plan is reported, not fatal
                entry["model_error"] = f"{type(e).__name__}: {e}"
        if b.startswith("stragg"):
            entry["decided"] = [{k: j["summary"].get(k) for k in (
                "tail_plans", "plan", "first_stragglar", "first_optcc", "degraded_ranks",
                "profile_straggler", "decisions", "planner_predicted_s")} for j in mine]
        backends[b] = entry
    cands = candidates(n, nbytes, alpha, beta, late_rank, delay, slow_ranks, sc["slowdown"],
                       host_of)
    best = min(cands, key=lambda k: cands[k])
    sc["late_rank"], sc["slow_ranks"], sc["delay_s"] = late_rank, slow_ranks, delay
    sc["model"] = {
        "compute_s": compute, "candidates_s": cands, "best": best,
        "best_allreduce_s": cands[best], "best_step_s": compute + cands[best],
        "ring_step_s": compute + cands["ring"],
        "ceiling": (compute + cands["ring"]) / (compute + cands[best]),
    }
    sc["backends"] = backends
    ratios = {}
    if "stragg" in backends:
        for b in ("gloo", "stragg-ring"):
            if b in backends:
                ratios[f"{b}/stragg"] = backends[b]["median_s"] / backends["stragg"]["median_s"]
                mine, theirs = (backends["stragg"].get("model_step_s"),
                                backends[b].get("model_step_s"))
                if mine and theirs:
                    ratios[f"{b}/stragg model"] = theirs / mine
    sc["ratios"] = ratios


# --------------------------------------------------------------------------------------------
# Output


def _fmt_spread(e: dict[str, Any]) -> str:
    return (f"{e['median_s']:.3f} [{e['iqr_s']:.3f}; {e['min_s']:.3f}-{e['max_s']:.3f}]")


def _where(first: dict[str, Any] | None) -> str:
    """ "from call 32 (step 33)", or "never"."""
    if not first:
        return "never"
    step = first.get("step")
    return f"from call {first['call']} (step {step + 1 if step is not None else '?'})"


def print_tables(doc: dict[str, Any], out: Any = None) -> None:
    out = out or sys.stdout

    def say(*a: Any) -> None:
        print(*a, file=out)

    cfg = doc["config"]
    tail = doc["analysis"]["tail"]
    sys.stderr.flush()
    for cl in doc["clusters"]:
        if not cl["scenarios"] or "backends" not in cl["scenarios"][0]:
            continue
        backends = list(cl["scenarios"][0]["backends"])
        say(f"\n== {cl['hosts']} hosts x {cfg['nproc_per_node']} rank, {cfg['rate']} "
            f"(goodput {doc['goodput']}), {doc['model']} {doc['params'] / 1e6:.2f} M params, "
            f"gradient {doc['grad_bytes'] / 2**20:.2f} MiB, D = {cl['delay_s'] * 1e3:.1f} ms "
            f"({cfg['straggler_mode']} at {cfg.get('late_at', 'backward')}), "
            f"l = {cfg['slowdown']:g}, {cfg['steps']} steps, "
            f"tail {tail}, reps {cfg['reps']}")
        say(f"step time (s, rank 0): median of the last {tail} steps [IQR; min-max]")
        head = f"{'scenario':<10} {'late':>4} {'slow':>4} "
        head += "".join(f" {b:<28}" for b in backends)
        head += (f" {'gloo/stragg':>11} {'(model)':>7} {'ring/stragg':>11} {'(model)':>7}"
                 f" {'max/med':>7}  loss diff vs gloo")
        say(head)
        for sc in cl["scenarios"]:
            bs = sc["backends"]
            line = (f"{sc['name']:<10} {_opt(sc['late_rank']):>4} "
                    f"{','.join(map(str, sc['slow_ranks'])) or '-':>4} ")
            line += "".join(f" {_fmt_spread(bs[b]):<28}" for b in backends)
            for b in ("gloo", "stragg-ring"):
                line += f" {_opt(sc['ratios'].get(f'{b}/stragg'), '.3f'):>11}"
                line += f" {_opt(sc['ratios'].get(f'{b}/stragg model'), '.3f'):>7}"
            line += f" {_opt(bs.get('stragg', {}).get('longest_over_median'), '.2f'):>7}  "
            line += ", ".join(f"{b} {bs[b]['loss_rel_diff']:.1e}" for b in backends
                              if b != "gloo" and bs[b].get("loss_rel_diff") is not None) or "-"
            say(line)
        say(f"\ncost model (alpha {doc['analysis']['alpha_s'] * 1e6:g} us, beta = 8/(rate*"
            f"{doc['goodput']})): step = compute {cl['compute_s'] * 1e3:.1f} ms "
            f"({cl['compute_source']}) + simulated all_reduce; measured / predicted step (s)")
        cells = [f"{b} meas/model" for b in backends]
        widths = [max(len(c), 13) for c in cells]
        head = f"{'scenario':<10}" + "".join(f"  {c:<{w}}" for c, w in zip(cells, widths))
        head += f"  {'best candidate: all_reduce, step':<42} {'ceiling':>7}"
        say(head)
        for sc in cl["scenarios"]:
            bs, m = sc["backends"], sc["model"]
            line = f"{sc['name']:<10}"
            for b, w in zip(backends, widths):
                cell = f"{bs[b]['median_s']:.3f} / {_opt(bs[b].get('model_step_s'), '.3f')}"
                line += f"  {cell:<{w}}"
            best = f"{m['best']}: {m['best_allreduce_s']:.3f}, {m['best_step_s']:.3f}"
            line += f"  {best:<42} {m['ceiling']:>7.3f}"
            say(line)
        say("\nwhat stragg decided (its first job of each scenario):")
        for sc in cl["scenarios"]:
            e = sc["backends"].get("stragg")
            if not e:
                continue
            d = e["decided"][0]
            plans = ", ".join(f"{p} x{c}" for p, c in (d.get("tail_plans") or {}).items()) or "-"
            deg = ", ".join(f"rank {r} l={float(f):.2f}" for r, f in
                            (d.get("degraded_ranks") or {}).items()) or "none"
            m = sc["model"]
            say(f"  {sc['name']:<10} tail steps ran {plans}; StragglAR "
                f"{_where(d.get('first_stragglar'))}; OptCC {_where(d.get('first_optcc'))}; "
                "profiler's straggler "
                f"{_opt(d.get('profile_straggler'))}; probed degraded ranks: {deg}")
            say(f"  {'':<10} stragg ran {d.get('plan')}: model all_reduce "
                f"{_opt(e.get('model_allreduce_s'), '.3f')} s (planner predicted "
                f"{_opt(d.get('planner_predicted_s'), '.3f')} s, measured "
                f"{e['allreduce_s']:.3f} s); model's best candidate {m['best']} at "
                f"{m['best_allreduce_s']:.3f} s (Ring {m['candidates_s']['ring']:.3f} s)")
            for dec in d.get("decisions") or []:
                say(f"  {'':<10} profiler, from call {dec.get('call')}: straggler "
                    f"{_opt(dec.get('straggler'))}: {dec.get('reason', '')}")
    out.flush()


def _opt(v: Any, fmt: str = "") -> str:
    return "-" if v is None else format(v, fmt)


def plot(doc: dict[str, Any], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tail = doc["analysis"]["tail"]
    clusters = [cl for cl in doc["clusters"] if cl["scenarios"]]
    ncols = max(len(cl["scenarios"]) for cl in clusters)
    fig, axes = plt.subplots(len(clusters), ncols, figsize=(4.6 * ncols, 3.6 * len(clusters)),
                             squeeze=False)
    for row, cl in zip(axes, clusters):
        for ax, sc in zip(row, cl["scenarios"]):
            steps_n = sc["jobs"][0]["steps"]
            for job in sc["jobs"]:
                b = job["backend"]
                ys = rank0(job, "step_s")
                first_rep = job["rep"] == 0
                ax.plot(range(1, len(ys) + 1), ys, color=COLORS.get(b, "tab:purple"),
                        lw=1.3 if first_rep else 0.7, alpha=1.0 if first_rep else 0.4,
                        label=f"{b}: {sc['backends'][b]['median_s']:.3f} s" if first_rep
                        else None)
            for b, e in sc["backends"].items():
                if e.get("model_step_s") is not None:
                    ax.axhline(e["model_step_s"], color=COLORS.get(b, "tab:purple"), ls=":",
                               lw=1)
            st = next((j for j in sc["jobs"] if j["backend"] == "stragg"), None)
            rep = (st or {}).get("stragg") or {}
            for key, color, what in (("first_stragglar", "tab:red", "StragglAR"),
                                     ("first_optcc", "tab:purple", "OptCC")):
                first = rep.get(key)
                if first and first.get("step") is not None:
                    ax.axvline(first["step"] + 1, color=color, ls="--", lw=1,
                               label=f"stragg: {first['plan']} from step {first['step'] + 1}")
            calls_before = rep.get("calls_before_step") or []
            for dec in (rep.get("profile") or {}).get("decisions") or []:
                step = step_of_call(int(dec["call"]), calls_before, int(rep.get("calls_end", 0)))
                if step is not None and dec.get("straggler") is not None:
                    ax.axvline(step + 1, color="tab:red", ls=":", lw=1,
                               label=f"profiler: straggler {dec['straggler']} from step {step + 1}")
            ax.axvspan(steps_n - tail + 0.5, steps_n + 0.5, color="gray", alpha=0.1, lw=0)
            desc = []
            if sc["late_rank"] is not None:
                desc.append(f"rank {sc['late_rank']} late {sc['delay_s'] * 1e3:.0f} ms")
            if sc["slow_ranks"]:
                desc.append(f"rank {','.join(map(str, sc['slow_ranks']))} link /"
                            f"{sc['slowdown']:g}")
            ax.set_title(f"{cl['hosts']} hosts, {sc['name']}"
                         + (f": {'; '.join(desc)}" if desc else ""), fontsize="medium")
            ax.set_xlabel("step")
            ax.set_ylabel("step time (s, rank 0)")
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize="x-small", loc="lower right")
        for ax in row[len(cl["scenarios"]):]:
            ax.set_visible(False)
    fig.suptitle(f"DDP training, {doc['model']} ({doc['grad_bytes'] / 2**20:.1f} MiB gradient), "
                 f"{doc['config']['rate']} per host; dotted: cost model; shaded: tail",
                 fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------


def load_docs(paths: str) -> dict[str, Any]:
    """One document from one or more --json outputs (their clusters joined)."""
    names = [f for f in paths.split(",") if f.strip()]
    docs = [json.loads(Path(f).read_text().strip().splitlines()[-1]) for f in names]
    doc = docs[0]
    for name, other in zip(names[1:], docs[1:]):
        if other["grad_bytes"] != doc["grad_bytes"] or other["rate_bit"] != doc["rate_bit"]:
            eprint(f"training: joining runs of different model/rate ({name}): the table header "
                   "shows the first one's")
        doc["clusters"].extend(other["clusters"])
    return doc


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        doc = load_docs(args.from_json)
        argv_l = argv if argv is not None else sys.argv[1:]
        tail = args.tail if "--tail" in argv_l else doc["analysis"]["tail"]
        alpha = args.alpha if "--alpha" in argv_l else doc["analysis"]["alpha_s"]
        analyse(doc, tail, alpha)
        print_tables(doc)
        if args.plot:
            eprint(f"figure: {plot(doc, args.plot)}")
        return 0
    from stragg.emucluster import EmuClusterError

    try:
        doc = collect(args)
    except JobFailed as e:
        eprint(f"training: {e}")
        return 1
    except EmuClusterError as e:
        eprint(f"training: emulated cluster: {e}")
        return 1
    analyse(doc, args.tail, args.alpha)
    print_tables(doc, sys.stderr if args.json else sys.stdout)
    if args.plot:
        doc["plot"] = plot(doc, args.plot)
        eprint(f"figure: {doc['plot']}")
    if args.json:
        print(json.dumps(doc), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
