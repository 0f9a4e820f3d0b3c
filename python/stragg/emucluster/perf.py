"""A tiny iperf for stragg.emucluster: TCP goodput from one emulated host to another.

    python perf.py recv                prints its port, then (after the sender closes) one JSON
                                       line {"bytes": ..., "seconds": ..., "bits_per_s": ...}
    python perf.py send ADDR PORT SECONDS

Run as a file (not `-m stragg.emucluster.perf`) so that it starts without importing torch. The receiver
times from its first byte to the end of the stream, so the connection setup is not counted.
"""

from __future__ import annotations

import json
import socket
import sys
import time

CHUNK = 1 << 20


def receive() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as srv:
        srv.bind(("0.0.0.0", 0))
        srv.listen(1)
        srv.settimeout(60)
        print(srv.getsockname()[1], flush=True)
        conn, _ = srv.accept()
    buf = bytearray(CHUNK)
    total, first, last = 0, None, None
    with conn:
        conn.settimeout(60)
        while True:
            n = conn.recv_into(buf)
            if not n:
                break
            last = time.monotonic()
            if first is None:
                first = last
            total += n
    seconds = (last - first) if first is not None and last is not None else 0.0
    rate = total * 8 / seconds if seconds > 0 else 0.0
    print(json.dumps({"bytes": total, "seconds": seconds, "bits_per_s": rate}), flush=True)


def send(addr: str, port: int, seconds: float) -> None:
    data = b"\0" * CHUNK
    with socket.create_connection((addr, port), timeout=60) as s:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            s.sendall(data)


def main(argv: list[str]) -> int:
    if argv[:1] == ["recv"] and len(argv) == 1:
        receive()
    elif argv[:1] == ["send"] and len(argv) == 4:
        send(argv[1], int(argv[2]), float(argv[3]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
