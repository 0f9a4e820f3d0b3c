"""Is a host reachable? For tests/test_emucluster.py's fault checks (run inside a host).

usage: emu_probe.py ADDR [ADDR ...] [--port P] [--timeout S]

Opens a TCP connection to ADDR:P (default port 9, where nothing listens) for each ADDR and prints
one JSON object {ADDR: outcome}: "refused" or "connected" (a reply came back: the host is
reachable), "timeout" (silence: packets dropped or a link down), or "error <errno name>" (e.g.
EHOSTUNREACH when the neighbour cannot be resolved). Every probe runs at once, in a thread each.
"""

from __future__ import annotations

import argparse
import errno
import json
import socket
import threading


def probe(addr: str, port: int, timeout: float) -> str:
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return "connected"
    except ConnectionRefusedError:
        return "refused"
    except socket.timeout:
        return "timeout"
    except OSError as exc:
        return f"error {errno.errorcode.get(exc.errno or 0, str(exc.errno))}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("addrs", nargs="+")
    ap.add_argument("--port", type=int, default=9)
    ap.add_argument("--timeout", type=float, default=1.0)
    args = ap.parse_args()
    out: dict[str, str] = {}
    threads = [
        threading.Thread(target=lambda a=a: out.__setitem__(a, probe(a, args.port, args.timeout)))
        for a in args.addrs
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
