"""torchft on stragg: two replica groups train together, one is killed and rejoins.

    python examples/torchft_replicas.py                  # stragg; replica 1 killed at step 4
    python examples/torchft_replicas.py --backend gloo   # the same with torchft's Gloo group
    python examples/torchft_replicas.py --steps 20 --kill-at 8 --json

What a torchft user changes for stragg is the process group handed to the Manager:

    from stragg.integrations.torchft import ProcessGroupStragg
    manager = Manager(pg=ProcessGroupStragg(), ...)

The script is its own launcher: it starts torchft's lighthouse and one process per replica
group (each replica: one rank, its own TCPStore, a small MLP built from a config dict, its own
synthetic data shard, torchft's DistributedDataParallel and OptimizerWrapper). When replica 1 has
committed --kill-at steps it stops inside the next step (so the kill lands mid-run however
loaded the machine is), the launcher SIGKILLs it and starts it again: replica 0's pending
all_reduce fails (stragg notices the dead peer), the step is not committed, the lighthouse
waits for both replicas (min 2), the restarted replica heals from replica 0's state, and the
Manager reconfigures the process group (a new stragg backend) for the new quorum.

Each step's batch depends only on (replica, step), so the committed losses and the final
weights are the same on stragg and Gloo, whenever the kill lands. The launcher prints replica
0's committed losses, whether the replicas' final weights are identical, and stragg's counters
summed over every reconfiguration (ProcessGroupStragg.stats()).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

CONFIG = {"inputs": 8, "hidden": 32, "outputs": 4}


# --------------------------------------------------------------------------------------------
# Replica (one process per replica group)


def build_model(config: dict[str, int]) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(config["inputs"], config["hidden"]),
        nn.Tanh(),
        nn.Linear(config["hidden"], config["outputs"]),
    )


def batch(replica: int, step: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(1000 * replica + step)
    x = torch.randn(16, CONFIG["inputs"], generator=g)
    w = torch.linspace(-1, 1, CONFIG["inputs"] * CONFIG["outputs"]).view(CONFIG["inputs"], -1)
    return x, torch.tanh(x @ w)


def make_pg(backend: str) -> Any:
    if backend == "stragg":
        from stragg.integrations.torchft import ProcessGroupStragg

        return ProcessGroupStragg(timeout=timedelta(seconds=20))
    from torchft.process_group import ProcessGroupGloo

    return ProcessGroupGloo(timeout=timedelta(seconds=20))


def replica_main(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    from torchft import Manager
    from torchft.ddp import DistributedDataParallel
    from torchft.optim import OptimizerWrapper

    torch.set_num_threads(1)
    model = build_model(CONFIG)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    pg = make_pg(args.backend)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=pg,
        min_replica_size=2,
        load_state_dict=lambda sd: (model.load_state_dict(sd["model"]),
                                    opt.load_state_dict(sd["optim"])),
        state_dict=lambda: {"model": model.state_dict(), "optim": opt.state_dict()},
        replica_id=f"replica_{args.replica_id}",
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=args.lighthouse,
        hostname="127.0.0.1",
        timeout=timedelta(seconds=20),
        quorum_timeout=timedelta(seconds=60),
        connect_timeout=timedelta(seconds=20),
    )  # fmt: skip
    ddp = DistributedDataParallel(manager, model)
    optimizer = OptimizerWrapper(manager, opt)
    losses: dict[int, float] = {}
    progress = open(args.progress, "a")  # noqa: SIM115 - kept open for the whole run
    while manager.current_step() < args.steps:
        step = manager.current_step()
        x, y = batch(args.replica_id, step)
        optimizer.zero_grad()  # starts the quorum (reconfigures the process group if needed)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        if step == args.hold_at:
            # The launcher's victim: stop inside this step (its peer is already in, or about to
            # enter, the step's all_reduce) and wait for the SIGKILL. Holding here rather than
            # racing the launcher makes the kill land mid-run however loaded the machine is.
            Path(args.progress + ".held").write_text(f"{step}\n")
            while True:
                time.sleep(1)
        loss.backward()  # the comm hook all_reduces through the Manager's process group
        optimizer.step()  # commits only if every participant's all_reduce succeeded
        if manager.current_step() > step:
            losses[step] = float(loss.detach())
            progress.write(f"{step + 1}\n")
            progress.flush()
    stats = pg.stats() if hasattr(pg, "stats") else None
    result = {
        "replica": args.replica_id,
        "losses": losses,
        "params": [p.detach().flatten().tolist() for p in model.parameters()],
        "stragg_stats": stats,
    }
    with open(args.result, "w") as f:
        json.dump(result, f)
    manager.shutdown(wait=False)
    return 0


# --------------------------------------------------------------------------------------------
# Launcher


def _start(
    args: argparse.Namespace, rid: int, addr: str, tmp: str, incarnation: int, hold_at: int = -1
) -> Any:
    cmd = [
        sys.executable, str(Path(__file__).resolve()), "--replica-id", str(rid),
        "--lighthouse", addr, "--backend", args.backend, "--steps", str(args.steps),
        "--progress", os.path.join(tmp, f"progress{rid}"),
        "--result", os.path.join(tmp, f"result{rid}.json"), "--hold-at", str(hold_at),
    ]  # fmt: skip
    log = open(os.path.join(tmp, f"replica{rid}.{incarnation}.log"), "w")  # noqa: SIM115
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def _committed(path: str) -> int:
    try:
        lines = Path(path).read_text().split()
    except FileNotFoundError:
        return 0
    return int(lines[-1]) if lines else 0


def _wait(procs: dict[int, Any], tmp: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for rid, proc in procs.items():
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs.values():
                p.kill()
            raise SystemExit(f"torchft_replicas: replica {rid} did not finish; logs in {tmp}")
        if proc.returncode != 0:
            log = max(Path(tmp).glob(f"replica{rid}.*.log")).read_text()
            raise SystemExit(f"torchft_replicas: replica {rid} failed:\n{log[-3000:]}")


def launcher(args: argparse.Namespace) -> int:
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(
        bind="127.0.0.1:0", min_replicas=2, join_timeout_ms=200, heartbeat_timeout_ms=2000
    )
    addr = lighthouse.address()
    t0 = time.monotonic()
    if args.workdir:
        os.makedirs(args.workdir, exist_ok=True)
        for old in Path(args.workdir).glob("*"):
            old.unlink()
    keep = contextlib.nullcontext(args.workdir) if args.workdir else None
    with keep or tempfile.TemporaryDirectory(prefix="stragg-torchft-") as tmp:
        victim = 1
        hold_at = args.kill_at if args.kill_at > 0 else -1
        procs = {rid: _start(args, rid, addr, tmp, 0, hold_at if rid == victim else -1)
                 for rid in range(2)}  # fmt: skip
        killed_at = None
        if args.kill_at > 0:
            progress = os.path.join(tmp, f"progress{victim}")
            held = Path(progress + ".held")
            while not held.exists():
                if procs[victim].poll() is not None:
                    log = Path(tmp, f"replica{victim}.0.log").read_text()
                    raise SystemExit(f"torchft_replicas: replica 1 ended before the kill:\n"
                                     f"{log[-3000:]}")  # fmt: skip
                time.sleep(0.02)
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait()
            killed_at = _committed(progress)
            print(f"killed replica {victim} after it committed step {killed_at}; restarting it",
                  file=sys.stderr, flush=True)  # fmt: skip
            procs[victim] = _start(args, victim, addr, tmp, 1)
        _wait(procs, tmp, args.timeout)
        results = [json.loads(Path(tmp, f"result{r}.json").read_text()) for r in range(2)]
    lighthouse.shutdown()
    r0 = results[0]
    losses = [r0["losses"][str(s)] for s in range(args.steps)]
    same = results[0]["params"] == results[1]["params"]
    out = {
        "backend": args.backend,
        "steps": args.steps,
        "killed_replica_after_step": killed_at,
        "losses": losses,
        "replicas_identical": same,
        "params": r0["params"],
        "stragg_stats": [r["stragg_stats"] for r in results],
        "wall_s": time.monotonic() - t0,
    }
    kill = f"replica 1 killed after step {killed_at} and rejoined" if killed_at else "no kill"
    print(f"{args.backend}: {args.steps} steps, {kill}; loss {losses[0]:.4f} -> "
          f"{losses[-1]:.4f}; final weights of the replicas "
          f"{'identical' if same else 'DIFFERENT'}")  # fmt: skip
    for r in results:
        st = r["stragg_stats"]
        if st:
            failed = st["failed_calls"]
            print(f"  replica {r['replica']}: stragg carried {st['allreduce_calls']} all_reduces "
                  f"over {st['configurations']} process-group configurations"
                  + (f"; {failed} failed when its peer was killed" if failed else ""))  # fmt: skip
    if args.json:
        print(json.dumps(out), flush=True)
    return 0 if same else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("stragg", "gloo"), default="stragg")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--kill-at", type=int, default=4, help="kill replica 1 after this committed "
                   "step (0: no kill)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=240, help="seconds for the whole run")
    p.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    p.add_argument("--workdir", default=None, help="keep the replicas' logs here (default: a "
                   "temporary directory, removed at the end)")  # fmt: skip
    # Internal: set by the launcher for its replicas.
    p.add_argument("--replica-id", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--lighthouse", default="", help=argparse.SUPPRESS)
    p.add_argument("--progress", default="", help=argparse.SUPPRESS)
    p.add_argument("--result", default="", help=argparse.SUPPRESS)
    p.add_argument("--hold-at", type=int, default=-1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.kill_at >= args.steps:
        p.error("--kill-at must be below --steps")
    return replica_main(args) if args.replica_id is not None else launcher(args)


if __name__ == "__main__":
    sys.exit(main())
