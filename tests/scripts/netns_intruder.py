"""A stray process for tests/test_netns.py, run inside rank 0's network namespace while rank 0
sets up its TCP mesh with rank 1. The test holds rank 1 back first: a policy rule on rank 0's
host (priority RULE_PRIO) sends rank 0's replies to rank 1's connections into a blackhole, so
rank 1's SYNs go unanswered and rank 0 keeps waiting with its port open.

The stranger connects three times to rank 0's port: garbage on one, a well-formed hello of
another protocol version claiming to be rank 1 on a second, nothing on the third. Once rank 0
dropped the first two, it deletes the rule (rank 1's next SYN retry gets in and the mesh
completes), then records whether the third was dropped once the mesh is up and whether the port
is still open afterwards (it stays open for re-dials). (tests/cpp/test_tcp_transport.cc checks
the same with threads.)

usage: netns_intruder.py HOST PORT RULE_PRIO OUT_JSON
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import time

HELLO_MAGIC = 0x5354524147475443  # "STRAGGTC", see csrc/transport/tcp/handshake.h


def connect(host: str, port: int, deadline: float) -> socket.socket:
    """Tries every 10 ms until rank 0's port is open (it opens it before the address exchange)."""
    while True:
        try:
            return socket.create_connection((host, port), timeout=2)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def dropped(s: socket.socket, timeout_s: float) -> bool:
    """True once the peer closed (or reset) the connection within timeout_s."""
    s.settimeout(timeout_s)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except (socket.timeout, OSError):
        return False


def main() -> None:
    host, port, prio, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    result: dict = {}
    try:
        deadline = time.monotonic() + 120
        garbage = connect(host, port, deadline)
        version = connect(host, port, deadline)
        idle = connect(host, port, deadline)
        garbage.sendall(os.urandom(64))
        # magic, version, channel, from, to, size, pad, from_nonce, to_nonce
        version.sendall(struct.pack("<QIIiiiIQQ", HELLO_MAGIC, 99, 0, 1, 0, 2, 0, 1, 2))
        result["garbage_dropped"] = dropped(garbage, 60.0)
        result["wrong_version_dropped"] = dropped(version, 60.0)
        result["idle_open_during_setup"] = not dropped(idle, 0.5)
    finally:  # let rank 1 in whatever happened above
        subprocess.run(["ip", "rule", "del", "prio", prio], check=True)
    result["idle_dropped_after_setup"] = dropped(idle, 60.0)
    try:
        socket.create_connection((host, port), timeout=2).close()
        result["port_open_after_setup"] = True
    except OSError:
        result["port_open_after_setup"] = False
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
