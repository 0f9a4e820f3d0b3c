"""Keep training when a rank dies: DDP on N ranks, one rank is SIGKILLed, the survivors shrink.

    python examples/shrink_on_failure.py                   # 4 ranks, rank 2 dies at step 5
    python examples/shrink_on_failure.py --backend gloo    # torch's refusal: Gloo cannot shrink
    python -m stragg.emucluster run --hosts 4 --no-fail-fast -- \\
        python examples/shrink_on_failure.py --worker --rundir DIR   # across emulated hosts

Every rank trains a small MLP with DDP on synthetic data (global batch of --batch samples per
step, split evenly over the ranks). At --kill-step, rank --kill-rank SIGKILLs itself. The
survivors' backward raises an error that names the dead rank; each survivor then calls
`dist.shrink_group([dead])`, rebuilds DDP on the shrunk default group, re-shards the data over
the survivors and finishes the remaining steps. Then (launcher mode) the script checks the result
against a fresh run of N-1 ranks started from the checkpoint taken at the failure step.

The script launches the ranks itself, with the TCPStore in the launcher's process: torchrun's
agent stops every worker as soon as one dies, so a job that carries on needs a launcher that
leaves the survivors alone (here; or `--worker` under one that sets RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT, like `python -m stragg.emucluster run --no-fail-fast`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    import stragg  # noqa: F401  (registers the "stragg" backend)
except ImportError:
    pass

IN, HIDDEN, OUT = 32, 256, 8


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, OUT))


def shard(step: int, batch: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's even share of step `step`'s global batch (the same data whatever the world)."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(batch, IN, generator=g)
    y = torch.randn(batch, OUT, generator=g)
    per = batch // world
    return x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]


def train(args: argparse.Namespace, rank: int, world: int, report: Any) -> None:
    """One rank's job: train, survive the kill (stragg), write what happened to `report`."""
    torch.set_num_threads(1)  # the ranks share the machine's cores
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    first = 0
    if args.resume:
        ckpt = torch.load(args.resume)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        first = ckpt["step"]
    ddp = DDP(model)
    out: dict[str, Any] = {"rank": rank, "losses": {}}
    step = first
    while step < args.steps:
        if rank == args.kill_rank and step == args.kill_step and not args.resume:
            with open(os.path.join(args.rundir, "killed_at"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = shard(step, args.batch, dist.get_rank(), dist.get_world_size())
        opt.zero_grad(set_to_none=True)
        try:
            loss = nn.functional.mse_loss(ddp(x), y)
            loss.backward()
        except RuntimeError as e:  # DistBackendError and what DDP wraps it in
            failed_at = time.time()
            out["error"] = str(e).splitlines()[0]
            out["failed_step"] = step
        else:
            opt.step()
            out["losses"][step] = loss.item()
            step += 1
            continue
        # Recovery, outside the except block (its traceback would keep the old DDP alive).
        del ddp
        t0 = time.monotonic()
        try:
            group = dist.shrink_group([args.kill_rank])  # the survivors' new default group
        except Exception as refused:  # Gloo (every backend but stragg and NCCL): TypeError
            out["shrink_refused"] = f"{type(refused).__name__}: {refused}"
            report(out)
            return
        out["shrink_s"] = time.monotonic() - t0
        if group.rank() == 0:
            # The checkpoint at the failure step: the failed step changed no parameter.
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                       os.path.join(args.rundir, "checkpoint.pt"))
        ddp = DDP(model)  # on the shrunk default group
        probe = torch.zeros(1)
        dist.all_reduce(probe)  # the first all_reduce on the shrunk group
        out["recovery_s"] = time.monotonic() - t0
        killed = os.path.join(args.rundir, "killed_at")
        if os.path.exists(killed):
            with open(killed) as f:
                out["detect_s"] = failed_at - float(f.read())
        out["new_rank"], out["new_world"] = group.rank(), group.size()
        if args.backend == "stragg":
            out["transport"] = stragg.backend_stats(group)["transport"]
        # The loop redoes the failed step on the survivors.
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    out["params_file"] = os.path.join(args.rundir, f"params{'_ref' if args.resume else ''}.pt")
    if dist.get_rank() == 0:
        torch.save(params, out["params_file"])
    out["params_digest"] = hashlib.sha256(params.numpy().tobytes()).hexdigest()
    report(out)


def _rank_main(args: argparse.Namespace, rank: int, world: int, port: int) -> None:
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False,
                          timeout=timedelta(seconds=args.timeout))
    dist.init_process_group(args.backend, store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=args.timeout))

    try:
        train(args, rank, world, _reporter(args, rank))
    finally:
        dist.destroy_process_group()


def _reporter(args: argparse.Namespace, rank: int) -> Any:
    """Where rank `rank` writes its report: <rundir>/report<rank>.json (report_ref<rank>.json in
    the reference run)."""
    def report(out: dict[str, Any]) -> None:
        name = f"report{'_ref' if args.resume else ''}{rank}.json"
        with open(os.path.join(args.rundir, name), "w") as f:
            json.dump(out, f)

    return report


def launch(args: argparse.Namespace, world: int) -> list[dict[str, Any]]:
    """Runs `world` ranks with the store in this process; returns the reports of the ranks that
    finished (a SIGKILLed rank reports nothing)."""
    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=args.timeout))
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(args, r, world, store.port))
             for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + args.timeout * 3
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            for q in procs:
                q.kill()
            raise SystemExit("shrink_on_failure: the ranks did not finish in time")
    reports = []
    for r in range(world):
        path = os.path.join(args.rundir, f"report{'_ref' if args.resume else ''}{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                reports.append(json.load(f))
    return reports


def summarize(args: argparse.Namespace, reports: list[dict[str, Any]],
              reference: list[dict[str, Any]] | None) -> dict[str, Any]:
    survivors = [r for r in reports if "shrink_s" in r]
    refused = [r for r in reports if "shrink_refused" in r]
    summary: dict[str, Any] = {"backend": args.backend, "ranks": args.ranks,
                               "killed": args.kill_rank, "kill_step": args.kill_step}
    if refused:
        summary["refused"] = refused[0]["shrink_refused"]
        summary["error"] = refused[0].get("error")
        return summary
    summary["survivors"] = [r["rank"] for r in survivors]
    summary["error"] = survivors[0]["error"] if survivors else None
    summary["detect_s"] = max((r.get("detect_s", 0.0) for r in survivors), default=None)
    summary["shrink_s"] = max((r["shrink_s"] for r in survivors), default=None)
    summary["recovery_s"] = max((r["recovery_s"] for r in survivors), default=None)
    summary["identical_on_all_ranks"] = len({r["params_digest"] for r in survivors}) == 1
    summary["final_loss"] = survivors[0]["losses"].get(str(args.steps - 1)) if survivors else None
    if reference is not None and survivors:
        mine = torch.load(survivors[0]["params_file"])
        ref = torch.load(reference[0]["params_file"])
        diff = ((mine - ref).abs().max() / ref.abs().max()).item()
        summary["reference_max_rel_diff"] = diff
        summary["reference_bitwise"] = bool(torch.equal(mine, ref))
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="stragg", help="stragg (default) or gloo")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--kill-rank", type=int, default=2)
    p.add_argument("--kill-step", type=int, default=5)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=48, help="global batch (divisible by N and N-1)")
    p.add_argument("--timeout", type=float, default=60.0, help="process group timeout, s")
    p.add_argument("--no-check", action="store_true",
                   help="skip the fresh N-1 rank run from the failure step's checkpoint")
    p.add_argument("--worker", action="store_true",
                   help="be one rank of a job started by another launcher (env://)")
    p.add_argument("--rundir", help="where the checkpoint and parameters go (default: a temp dir)")
    p.add_argument("--resume", metavar="CHECKPOINT",
                   help="only the reference run: --ranks ranks from this checkpoint")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    args = p.parse_args()
    args.rundir = args.rundir or tempfile.mkdtemp(prefix="shrink-on-failure-")

    if args.worker:  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher
        dist.init_process_group(args.backend, timeout=timedelta(seconds=args.timeout))
        rank = dist.get_rank()
        train(args, rank, dist.get_world_size(), _reporter(args, rank))
        dist.destroy_process_group()
        return

    if args.resume:
        reference = launch(args, args.ranks)
        print(json.dumps({"params_file": reference[0]["params_file"]} if reference else {}))
        return
    reports = launch(args, args.ranks)
    reference = None
    if not args.no_check and any("shrink_s" in r for r in reports):
        ckpt = os.path.join(args.rundir, "checkpoint.pt")
        ref_args = argparse.Namespace(**{**vars(args), "resume": ckpt})
        reference = launch(ref_args, args.ranks - 1)
    summary = summarize(args, reports, reference)
    if args.json:
        print(json.dumps(summary))
        return
    if "refused" in summary:
        print(f"{args.backend}: rank {args.kill_rank} died at step {args.kill_step}: "
              f"{summary['error']}\n{args.backend}: shrink_group refused: {summary['refused']}")
        sys.exit(1)
    print(f"{args.backend}: rank {args.kill_rank} SIGKILLed at step {args.kill_step}; "
          f"the survivors saw: {summary['error']}")
    print(f"  failure detected after {summary['detect_s']:.3f} s; shrink_group took "
          f"{summary['shrink_s']:.3f} s; first all_reduce on the {len(summary['survivors'])} "
          f"survivors {summary['recovery_s']:.3f} s after the error")
    print(f"  finished {args.steps} steps, final loss {summary['final_loss']:.6f}, parameters "
          f"identical on every survivor: {summary['identical_on_all_ranks']}")
    if reference is not None:
        print(f"  vs a fresh {args.ranks - 1}-rank run from the step-{args.kill_step} "
              f"checkpoint: max relative difference {summary['reference_max_rel_diff']:.2e}"
              f" (bitwise equal: {summary['reference_bitwise']})")


if __name__ == "__main__":
    main()
