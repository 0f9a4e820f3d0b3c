"""One rank of benchmarks/training.py (started under torchrun on every emulated host).

Environment: what torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...), what
stragg.emucluster sets (EMU_HOST: this host's index), and TRAINING_BENCH_CONFIG (JSON: backend,
model and data options, steps, late host and delay, result path; see training.py's job_config).

Plain DistributedDataParallel on the demo's transformer (examples/finetune.py: build_model,
make_batches), one gradient bucket (one all_reduce per step), AdamW, seeds fixed so that every
backend trains the same model on the same data. The late process (local rank 0 on the late host)
is late for every gradient all_reduce: with late_at "allreduce" every rank runs DDP with torch's
allreduce comm hook and the late one waits D in it, when its gradient is ready (it arrives D
late); with "backward" it waits D between its forward and its backward pass (on hosts that share
cores its backward then runs faster than the others', so it arrives less than D late).

Per step and rank: the step's wall time (end of the previous step to the end of this one), and
its parts: forward, the late rank's wait, backward compute (to the last gradient accumulated:
a post-accumulate-grad hook on every parameter), the all_reduce (from there to the end of
backward(), where DDP waits for its bucket: with one bucket nothing else overlaps it) and the
optimizer step. All of it, the per-step losses (mean over ranks) and, for stragg, the per-call
records, the backend's counters and the profiler's summary, go through all_gather (no extra
all_reduce) to rank 0, which writes them as one JSON file.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import time
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

REPO_ROOT = Path(__file__).resolve().parent.parent
FINETUNE = REPO_ROOT / "examples" / "finetune.py"
# Columns of the per-step record of every rank.
PARTS = ("step_s", "forward_s", "late_s", "backward_s", "allreduce_s", "optimizer_s")


def load_finetune() -> ModuleType:
    """examples/finetune.py as a module (by path: the benchmark uses the demo's model and data
    without putting the source tree on sys.path)."""
    spec = importlib.util.spec_from_file_location("_stragg_example_finetune", FINETUNE)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {FINETUNE}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def model_args(cfg: dict[str, Any]) -> argparse.Namespace:
    """The options finetune.build_model / make_batches read."""
    return argparse.Namespace(
        seed=cfg["seed"], model=cfg["model"], vocab=cfg["vocab"], seq=cfg["seq"],
        d_model=cfg["d_model"], layers=cfg["layers"], heads=cfg["heads"], steps=cfg["steps"],
        batch=cfg["batch"],
    )


def wait(seconds: float, mode: str) -> None:
    """The late rank's extra time: sleep (each emulated host would have its own CPU; spinning
    would take the shared cores from the other hosts) or spin (--straggler-mode busy)."""
    if mode == "busy":
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
    else:
        time.sleep(seconds)


def plain(obj: Any) -> Any:
    """A JSON-ready copy (dict keys as strings; tuples as lists; other objects as strings)."""
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)


def step_of_call(idx: int, calls_before: list[int], calls_end: int) -> int | None:
    """The 0-based step during which the all_reduce with 0-based index `idx` was issued."""
    if not calls_before or idx < calls_before[0] or idx >= calls_end:
        return None
    lo, hi = 0, len(calls_before) - 1
    while lo < hi:  # the last step whose first call index <= idx
        mid = (lo + hi + 1) // 2
        if calls_before[mid] <= idx:
            lo = mid
        else:
            hi = mid - 1
    return lo


def stragg_report(stragg: Any, calls_before: list[int], calls_end: int,
                  steps: int) -> dict[str, Any]:
    """Rank 0's view of what stragg did: per-call records mapped to steps, counters, profiler."""
    import stragg.profiler

    calls = stragg.recent_calls()
    try:
        profile: Any = dict(stragg.profiler.summary())
    except Exception as e:  # noqa: BLE001 - debug info must not fail the benchmark
        profile = {"error": f"{type(e).__name__}: {e}"}
    stats = dict(stragg.backend_stats())
    # recent_calls keeps the last 1024 calls, numbered consecutively: the last one is call
    # calls_end - 1 of this group.
    offset = (calls_end - len(calls)) - calls[0]["seq"] if calls else 0
    per_step: list[list[str]] = [[] for _ in range(steps)]
    records = []
    first: dict[str, dict[str, Any] | None] = {"stragglar": None, "optcc": None}
    for c in calls:
        idx = int(c["seq"]) + offset
        step = step_of_call(idx, calls_before, calls_end)
        plan = str(c.get("plan") or c.get("algorithm"))
        if step is not None:
            per_step[step].append(plan)
        for kind in first:
            if first[kind] is None and plan.removeprefix("host:").startswith(kind):
                first[kind] = {"call": idx, "step": step, "plan": plan}
        records.append({
            "call": idx, "step": step, "plan": plan, "bytes": c.get("bytes"),
            "straggler": c.get("straggler"), "predicted_s": c.get("predicted_s"),
            "queued_s": c.get("queued_s"), "run_s": c.get("run_s"), "wait_s": c.get("wait_s"),
            "pre_arrival_s": c.get("pre_arrival_s"), "ok": c.get("ok"),
        })
    return {
        "plans_per_step": per_step,
        "calls": records,
        "calls_end": calls_end,
        "calls_before_step": calls_before,
        "first_stragglar": first["stragglar"],
        "first_optcc": first["optcc"],
        "degraded_ranks": plain(stats.get("degraded_ranks", {})),
        "backend_stats": plain(stats),
        "profile": plain(profile),
    }


def main() -> None:
    cfg = json.loads(os.environ["TRAINING_BENCH_CONFIG"])
    torch.set_num_threads(1)  # the emulated hosts share the machine's cores
    backend = cfg["backend"]
    stragg: Any = None
    if backend.startswith("stragg"):
        import stragg  # registers the backend (torch's autoload does too)
    dist.init_process_group("stragg" if stragg is not None else "gloo",
                            timeout=timedelta(seconds=cfg["timeout_s"]))
    rank, world = dist.get_rank(), dist.get_world_size()
    host = int(os.environ.get("EMU_HOST", rank))
    local = int(os.environ.get("LOCAL_RANK", 0))
    late = cfg["late_host"] is not None and host == cfg["late_host"] and local == 0
    delay_s = float(cfg["delay_s"]) if late else 0.0
    late_at = cfg["late_at"]
    # Who is where: torchrun's c10d rendezvous numbers the hosts by address string, so rank and
    # host index can differ (e.g. beyond 9 hosts): the launcher's model needs the ranks.
    where: list[Any] = [None] * world
    dist.all_gather_object(where, (host, local, late))

    ft = load_finetune()
    margs = model_args(cfg)
    model, model_desc = ft.build_model(margs)
    params = sum(p.numel() for p in model.parameters())
    grad_bytes = 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)
    last_grad = [0.0]

    def grad_ready(_p: torch.Tensor) -> None:
        last_grad[0] = time.perf_counter()

    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(grad_ready)
    # One bucket: the whole gradient is one all_reduce per step, issued when backward ends.
    ddp = DDP(model, bucket_cap_mb=grad_bytes / 2**20 + 1.0)
    hook_wait = [0.0]  # the late rank's wait in the comm hook, this step

    def late_allreduce_hook(state, bucket):  # type: ignore[no-untyped-def]
        # No annotations: DDP compares them with dist.GradBucket, and this module's are strings.
        if late and delay_s > 0:
            t = time.perf_counter()
            wait(delay_s, cfg["straggler_mode"])
            hook_wait[0] += time.perf_counter() - t
        return default_hooks.allreduce_hook(state, bucket)

    if late_at == "allreduce":
        ddp.register_comm_hook(None, late_allreduce_hook)
    opt = torch.optim.AdamW(ddp.parameters(), lr=cfg["lr"], weight_decay=0.0)
    batches = ft.make_batches(margs, rank)

    def stragg_calls() -> int:
        return int(stragg.backend_stats()["allreduce_calls"])

    steps = cfg["steps"]
    rec = torch.zeros(steps, len(PARTS), dtype=torch.float64)
    losses = torch.zeros(steps, dtype=torch.float64)
    calls_before: list[int] = []
    track = stragg is not None and rank == 0
    dist.barrier()
    t_job = t_prev = time.perf_counter()
    for step in range(steps):
        if track:
            calls_before.append(stragg_calls())
        x = batches[step]
        t0 = time.perf_counter()
        loss = ddp(input_ids=x, labels=x).loss
        t1 = time.perf_counter()
        if late and delay_s > 0 and late_at == "backward":
            wait(delay_s, cfg["straggler_mode"])
        t2 = last_grad[0] = time.perf_counter()
        hook_wait[0] = 0.0
        loss.backward()  # DDP all_reduces the one bucket when the last gradient is ready
        t3 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses[step] = float(loss.detach())
        t4 = time.perf_counter()
        tg = max(last_grad[0], t2)
        hw = hook_wait[0]
        rec[step] = torch.tensor([t4 - t_prev, t1 - t0, t2 - t1 + hw, tg - t2, t3 - tg - hw,
                                  t4 - t3],
                                 dtype=torch.float64)
        t_prev = t4
        if rank == 0 and cfg.get("progress_every") and (step + 1) % cfg["progress_every"] == 0:
            print(f"[{backend}] step {step + 1}/{steps}: loss {float(losses[step]):.4f}, "
                  f"{float(rec[step, 0]) * 1e3:.1f} ms", flush=True)
    train_s = time.perf_counter() - t_job
    calls_end = stragg_calls() if track else 0

    # Everything to rank 0 by all_gather (delegated to Gloo on stragg: no extra all_reduce).
    all_rec = [torch.empty_like(rec) for _ in range(world)]
    dist.all_gather(all_rec, rec)
    all_loss = [torch.empty_like(losses) for _ in range(world)]
    dist.all_gather(all_loss, losses)
    report = stragg_report(stragg, calls_before, calls_end, steps) if track else None
    if stragg is not None:
        import stragg.profiler

        try:  # every rank's view of the straggler decision (should agree)
            mine = stragg.profiler.summary().get("straggler")
        except Exception:  # noqa: BLE001
            mine = "error"
        seen: list[Any] = [None] * world
        dist.all_gather_object(seen, mine)
        if report is not None:
            report["profile_straggler_per_rank"] = seen

    if rank == 0:
        late_ranks = [r for r, (_h, _l, is_late) in enumerate(where) if is_late]
        result: dict[str, Any] = {
            "backend": backend,
            "world": world,
            "host_of_rank": [h for h, _l, _x in where],
            "local_of_rank": [lr for _h, lr, _x in where],
            "late_rank": late_ranks[0] if late_ranks else None,
            "slow_ranks": [r for r, (h, _l, _x) in enumerate(where) if h == cfg["slow_host"]]
            if cfg["slow_host"] is not None else [],
            "delay_s": float(cfg["delay_s"]) if late_ranks else 0.0,
            "model": model_desc,
            "params": params,
            "grad_bytes": grad_bytes,
            "steps": steps,
            "train_s": train_s,
            "parts": list(PARTS),
            # per_rank[r][part][step]
            "per_rank": [{name: t[:, i].tolist() for i, name in enumerate(PARTS)}
                         for t in all_rec],
            "losses": torch.stack(all_loss).mean(0).tolist(),
            "stragg": report,
        }
        tmp = cfg["result"] + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f)
        os.replace(tmp, cfg["result"])
    # Free DDP (its reducer holds the process group) before the group goes: transformers'
    # models sit in reference cycles (see examples/finetune.py).
    ddp = model = opt = None
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
