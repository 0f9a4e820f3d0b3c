"""One rank of tests/test_mixed_transport.py: 2 emulated hosts x 2 ranks (stragg.emucluster sets
RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; ranks 0, 1 on host 0 and 2, 3 on host 1).

usage: mixed_rank.py OUT_DIR   (writes OUT_DIR/rank<RANK>.json)

In order, on one process group per case:
  1. the default group (STRAGG_TRANSPORT as the test sets it): its backend_stats;
  2. per algorithm (pg_options algo=..., straggler 1): all_reduce of integer-valued float32
     (exact against the float64 reference) and of random float32 (close to it); SHA-256 digests
     of the results for the bitwise comparison across ranks, and the algorithm that ran; the
     same with host_level=on (the host-level plan of each algorithm);
  3. the dynamic straggler (agreed on the store board): exact;
  4. a numel mismatch (rank 3 passes fewer elements): the error every rank raises;
  5. rank 3 SIGKILLs itself while the others all_reduce on the default group: their errors and
     how long they took.
The result is written after every stage (atomically), so a rank that dies or hangs
still reports how far it got; the process ends with os._exit (nothing can hang at shutdown).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

import stragg

ALGOS = ("ring", "rhd", "direct", "stragglar", "optcc", "stragglar_direct")
# Host-level plans of these (STRAGG_HOST_LEVEL=on): a reduce-scatter in each host, the algorithm
# across the two hosts, an allgather in each host.
HOST_LEVEL_ALGOS = ("ring", "rhd", "direct", "optcc", "stragglar_direct", "stragglar")
SIZES = (7, 300007)
KILLED = 3


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def write_json(path: str, obj: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def check_algorithm(algo: str, rank: int, world: int, host_level: str = "auto") -> dict:
    group = dist.new_group(backend="stragg", pg_options={"algo": algo, "straggler": 1,
                                                        "host_level": host_level})
    out: dict = {"digests": [], "exact": True, "max_rel_err": 0.0}
    for numel in SIZES:
        base = torch.arange(numel, dtype=torch.float32) % 29
        t = base + rank
        dist.all_reduce(t, group=group)
        out["exact"] &= bool(torch.equal(t, base * world + world * (world - 1) / 2))
        out["digests"].append(digest(t))
        gens = [torch.Generator().manual_seed(1000 * r + numel) for r in range(world)]
        inputs = [torch.randn(numel, generator=g, dtype=torch.float64) for g in gens]
        x = inputs[rank].float()
        dist.all_reduce(x, group=group)
        ref = sum(inputs)
        err = ((x.double() - ref).abs() / (ref.abs() + 1.0)).max().item()
        out["max_rel_err"] = max(out["max_rel_err"], err)
        out["digests"].append(digest(x))
    out["ran"] = sorted({c["algorithm"] for c in stragg.recent_calls(group)})
    out["plans"] = sorted({c["plan"] for c in stragg.recent_calls(group)})
    dist.destroy_process_group(group)
    return out


def check_dynamic(rank: int, world: int) -> dict:
    group = dist.new_group(backend="stragg", pg_options={"straggler": "dynamic"})
    base = torch.arange(100003, dtype=torch.float32) % 13
    t = base + rank
    if rank == 2:
        time.sleep(0.2)
    dist.all_reduce(t, group=group)
    stats = stragg.backend_stats(group)
    out = {
        "exact": bool(torch.equal(t, base * world + world * (world - 1) / 2)),
        "digest": digest(t),
        "dynamic_calls": stats["dynamic_straggler_calls"] + stats["dynamic_plain_calls"],
    }
    dist.destroy_process_group(group)
    return out


def check_mismatch(rank: int) -> str:
    group = dist.new_group(backend="stragg", timeout=timedelta(seconds=30))
    t = torch.ones(100 if rank == KILLED else 200)
    try:
        dist.all_reduce(t, group=group)
        return "completed"
    except Exception as exc:  # noqa: BLE001  (the test checks the message)
        return f"{type(exc).__name__}: {exc}"


def check_kill(rank: int, world: int) -> dict:
    t = torch.ones(1000)
    dist.all_reduce(t)
    out: dict = {"first_sum": float(t[0])}
    if rank == KILLED:
        time.sleep(0.5)  # the others are inside their all_reduce by now, waiting for us
        os.kill(os.getpid(), signal.SIGKILL)
    big = torch.ones(4 << 20)
    start = time.monotonic()
    try:
        dist.all_reduce(big)
        out["second"] = "completed"
    except Exception as exc:  # noqa: BLE001
        out["second"] = f"{type(exc).__name__}: {exc}"
    out["second_after_s"] = time.monotonic() - start
    return out


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    out_path = os.path.join(sys.argv[1], f"rank{rank}.json")
    result: dict = {"rank": rank, "ok": False, "stage": "init"}
    torch.set_num_threads(1)
    try:
        dist.init_process_group("stragg", timeout=timedelta(seconds=60))
        stats = stragg.backend_stats()
        result["transport"] = stats["transport"]
        result["peer_transports"] = {str(k): v for k, v in stats["peer_transports"].items()}
        result["host_index"] = stats.get("host_index")
        for algo in ALGOS:
            result["stage"] = algo
            result.setdefault("algorithms", {})[algo] = check_algorithm(algo, rank, world)
            write_json(out_path, result)
        for algo in HOST_LEVEL_ALGOS:
            result["stage"] = f"host-level {algo}"
            result.setdefault("host_level", {})[algo] = check_algorithm(algo, rank, world, "on")
            write_json(out_path, result)
        result["stage"] = "dynamic"
        result["dynamic"] = check_dynamic(rank, world)
        result["stage"] = "mismatch"
        result["mismatch"] = check_mismatch(rank)
        write_json(out_path, result)
        result["stage"] = "kill"
        result["kill"] = check_kill(rank, world)
        result["ok"] = True
    except BaseException as exc:  # noqa: BLE001  (reported to the test)
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
    write_json(out_path, result)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
