"""A stray process for tests/test_netns.py, run inside rank 0's network namespace: it connects to
rank 0's TCP transport port while the mesh is being set up (the port is open for milliseconds:
it tries without pause), stops rank 1 (SIGSTOP) as soon as it got in, and continues it once its
three connections are open, so that rank 0 must judge them while it waits for rank 1: garbage on one, a well-formed hello of another protocol version claiming to be
rank 1 on a second, nothing on a third. Records which ones rank 0 dropped and whether the port
is closed once the mesh is up.

If rank 1 connected first (the mesh is up and the port closed) it records connected: false.
(tests/cpp/test_tcp_transport.cc checks the same deterministically with threads.)

usage: netns_intruder.py HOST PORT RANK1_PID_FILE OUT_JSON
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import time

HELLO_MAGIC = 0x5354524147475443  # "STRAGGTC", see csrc/transport/tcp/handshake.h


def connect(host: str, port: int, deadline: float, rank1: int) -> socket.socket:
    """Tries without pause (the port is open only while the mesh is being set up) until it gets
    in, the deadline passes, or rank 1 has gone (the job finished: the window was missed)."""
    while True:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.connect((host, port))
            return s
        except OSError:
            s.close()
            if time.monotonic() > deadline or not os.path.exists(f"/proc/{rank1}"):
                raise


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
    host, port, pid_file, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    result: dict = {"connected": False}
    deadline = time.monotonic() + 120
    while not os.path.exists(pid_file):
        time.sleep(0.01)
    time.sleep(0.05)  # the file is written, not renamed: let it be complete
    with open(pid_file) as f:
        rank1 = int(f.read())
    try:
        garbage = connect(host, port, deadline, rank1)
    except OSError:  # the ranks finished without the port ever accepting us
        with open(out, "w") as f:
            json.dump(result, f)
        return
    os.kill(rank1, signal.SIGSTOP)
    try:
        result["connected"] = True
        garbage.sendall(os.urandom(64))
        version = socket.create_connection((host, port), timeout=2)
        # magic, version, channel, from, to, size, pad, from_nonce, to_nonce
        version.sendall(struct.pack("<QIIiiiIQQ", HELLO_MAGIC, 99, 0, 1, 0, 2, 0, 1, 2))
        idle = socket.create_connection((host, port), timeout=2)
    finally:
        os.kill(rank1, signal.SIGCONT)
    result["garbage_dropped"] = dropped(garbage, 60.0)
    result["wrong_version_dropped"] = dropped(version, 60.0)
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
