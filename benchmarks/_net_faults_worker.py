"""One rank of benchmarks/net_faults.py (on every emulated host: directly, or under torchrun).

Environment: RANK, WORLD_SIZE, ... (set by stragg.emucluster or torchrun), what stragg.emucluster sets (EMU_HOST),
and NET_FAULTS_CONFIG (JSON: backend, model and data options, steps, process-group timeout,
progress directory; see net_faults.py's job_config).

The training benchmark's job (benchmarks/_training_worker.py: examples/finetune.py's model and
data loaded by path, seeds fixed, plain DistributedDataParallel with one gradient bucket = one
all_reduce per step, AdamW), without a late rank. Nothing is gathered at the end: every rank
appends one JSON line per event to PROGRESS_DIR/rank<RANK>.jsonl, flushed at once, so that the
launcher knows how far every rank got even when the job dies under a network fault:

  {"kind": "start", rank, host, world, pid, t}
  {"kind": "step", step (1-based), t (time.time() at its end), step_s, allreduce_s, loss (this
   rank's), stats (stragg only: backend_stats()'s scalar counters at the end of the step)}
  {"kind": "end", ok, t, steps, stage, error (first line of the exception), error_type, stragg
   (stragg only: the counters, the profiler's summary, and on rank 0 the per-call records
   mapped to steps, as the training benchmark reports them)}

A rank whose training raises writes its end record and leaves at once (os._exit(1)): tearing
down a group whose peers are gone can hang, and the launcher has what it needs.
"""

from __future__ import annotations

import gc
import json
import os
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _training_worker import load_finetune, model_args, plain, stragg_report
from torch.nn.parallel import DistributedDataParallel as DDP


def scalar_stats(stragg: Any) -> dict[str, Any]:
    """backend_stats()'s scalar entries (counters, names), or {"error": ...}."""
    try:
        stats = dict(stragg.backend_stats())
    except Exception as e:  # noqa: BLE001 - a dead group's counters may be gone
        return {"error": f"{type(e).__name__}: {e}"}
    return {str(k): v for k, v in stats.items()
            if v is None or isinstance(v, (bool, int, float, str))}


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def end_report(stragg: Any, rank: int, calls_before: list[int], steps: int) -> dict[str, Any]:
    """What stragg did: counters and profiler summary on every rank; rank 0 adds its per-call
    records mapped to steps (benchmarks/_training_worker.stragg_report)."""
    out: dict[str, Any] = {"stats": scalar_stats(stragg)}
    try:
        out["degraded_ranks"] = plain(dict(stragg.backend_stats()).get("degraded_ranks", {}))
    except Exception:  # noqa: BLE001
        pass
    try:
        import stragg.profiler

        prof = dict(stragg.profiler.summary())
        out["profile"] = plain({k: prof.get(k) for k in (
            "applied", "plan_checks", "decisions", "straggler", "calls", "exchanges",
            "model_corrections")})
    except Exception as e:  # noqa: BLE001 - debug info must not fail the benchmark
        out["profile"] = {"error": f"{type(e).__name__}: {e}"}
    if rank == 0 and calls_before:
        try:
            calls_end = int(stragg.backend_stats()["allreduce_calls"])
            rep = stragg_report(stragg, calls_before, calls_end, steps)
            out["plans_per_step"] = rep["plans_per_step"]
            out["calls"] = rep["calls"]
        except Exception as e:  # noqa: BLE001
            out["calls_error"] = f"{type(e).__name__}: {e}"
    return out


def main() -> None:
    cfg = json.loads(os.environ["NET_FAULTS_CONFIG"])
    torch.set_num_threads(1)  # the emulated hosts share the machine's cores
    rank = int(os.environ["RANK"])
    host = int(os.environ.get("EMU_HOST", rank))
    steps = int(cfg["steps"])
    log = open(Path(cfg["progress_dir"]) / f"rank{rank}.jsonl", "a", buffering=1)

    def emit(**rec: Any) -> None:
        log.write(json.dumps(plain(rec)) + "\n")
        log.flush()

    emit(kind="start", rank=rank, host=host, world=int(os.environ.get("WORLD_SIZE", 0)),
         pid=os.getpid(), t=time.time(), backend=cfg["backend"])
    stragg: Any = None
    stage, done = "init", 0
    calls_before: list[int] = []
    try:
        if cfg["backend"] == "stragg":
            import stragg  # registers the backend (torch's autoload does too)
        dist.init_process_group("stragg" if stragg is not None else "gloo",
                                timeout=timedelta(seconds=cfg["pg_timeout_s"]))
        stage = "setup"
        ft = load_finetune()
        margs = model_args(cfg)
        model, _desc = ft.build_model(margs)
        grad_bytes = 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)
        last_grad = [0.0]

        def grad_ready(_p: torch.Tensor) -> None:
            last_grad[0] = time.perf_counter()

        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(grad_ready)
        ddp = DDP(model, bucket_cap_mb=grad_bytes / 2**20 + 1.0)  # one bucket
        opt = torch.optim.AdamW(ddp.parameters(), lr=cfg["lr"], weight_decay=0.0)
        batches = ft.make_batches(margs, dist.get_rank())
        dist.barrier()
        stage = "train"
        t_prev = time.perf_counter()
        for step in range(steps):
            if stragg is not None:
                calls_before.append(int(stragg.backend_stats()["allreduce_calls"]))
            x = batches[step]
            loss = ddp(input_ids=x, labels=x).loss
            t2 = last_grad[0] = time.perf_counter()
            loss.backward()  # DDP all_reduces the one bucket when the last gradient is ready
            t3 = time.perf_counter()
            opt.step()
            opt.zero_grad(set_to_none=True)
            value = float(loss.detach())
            t4 = time.perf_counter()
            done = step + 1
            rec: dict[str, Any] = {"step": done, "t": time.time(), "step_s": t4 - t_prev,
                                   "allreduce_s": t3 - max(last_grad[0], t2), "loss": value}
            if stragg is not None:
                rec["stats"] = scalar_stats(stragg)
            emit(kind="step", **rec)
            t_prev = t4
        stage = "end"
        emit(kind="end", ok=True, t=time.time(), steps=done, stage=stage,
             stragg=end_report(stragg, rank, calls_before, steps) if stragg else None)
    except Exception as e:  # noqa: BLE001 - reported to the launcher, then this rank leaves
        emit(kind="end", ok=False, t=time.time(), steps=done, stage=stage,
             error=first_line(e), error_type=type(e).__name__,
             traceback=traceback.format_exc()[-3000:],
             stragg=end_report(stragg, rank, calls_before, steps) if stragg else None)
        log.close()
        os._exit(1)
    # Free DDP (its reducer holds the process group) before the group goes: transformers'
    # models sit in reference cycles (see examples/finetune.py).
    ddp = model = opt = None
    gc.collect()
    dist.destroy_process_group()
    log.close()


if __name__ == "__main__":
    main()
