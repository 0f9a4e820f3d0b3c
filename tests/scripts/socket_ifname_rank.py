"""One rank of tests/test_socket_ifname.py: emulated hosts with two NICs (stragg.emucluster sets
RANK, WORLD_SIZE, MASTER_ADDR on NIC 0, MASTER_PORT, GLOO_SOCKET_IFNAME, EMU_NICS).

usage: socket_ifname_rank.py OUT_DIR

Creates a stragg group (the interfaces come from the environment the test gives), runs 4
all_reduces of 256 KiB of integer-valued float32 and checks them against the float64 reference;
records the transport, SHA-256 digests of the results, and the local addresses of this process's
established TCP connections other than those to the store (MASTER_PORT): the addresses stragg's
transport connects from. Or the error init_process_group raised. Writes OUT_DIR/rank<RANK>.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import sys
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

import stragg

NUMEL = 1 << 16


def _established_local_addresses(skip_port: int) -> list[str]:
    """Local IPv4 addresses of this process's established TCP sockets (not to `skip_port`)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = set()
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            cols = line.split()
            local, remote, state, inode = cols[1], cols[2], cols[3], cols[9]
            if state != "01" or inode not in inodes:  # 01: ESTABLISHED
                continue
            laddr, lport = local.split(":")
            _, rport = remote.split(":")
            if int(rport, 16) == skip_port or int(lport, 16) == skip_port:
                continue
            out.add(socket.inet_ntoa(struct.pack("<I", int(laddr, 16))))
    return sorted(out)


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    out_dir = sys.argv[1]
    result: dict = {"rank": rank, "ok": False}
    torch.set_num_threads(1)
    try:
        dist.init_process_group("stragg", timeout=timedelta(seconds=60))
        exact, digests = [], []
        for i in range(4):
            base = (torch.arange(NUMEL, dtype=torch.float64) * (i + 1)) % 89
            t = (base + rank).float()
            reference = base * world + world * (world - 1) / 2  # float64, exact in float32
            dist.all_reduce(t)
            exact.append(bool(torch.equal(t.double(), reference)))
            digests.append(hashlib.sha256(t.numpy().tobytes()).hexdigest())
        result.update({
            "transport": stragg.backend_stats()["transport"], "exact": exact, "digests": digests,
            "addresses": _established_local_addresses(int(os.environ["MASTER_PORT"])), "ok": True,
        })  # fmt: skip
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001  (reported to the test)
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
