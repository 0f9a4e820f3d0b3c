"""TCP echo over an emulated cluster link, for tests/test_emucluster.py's cut/restore, pull and
reset tests.

usage: emu_echo.py server PORT        echoes every byte back; prints "listening" once bound, and
                                      when its connection ends "closed" (the peer closed it) or
                                      "error <exception>" (e.g. a reset)
       emu_echo.py client ADDR PORT   for every line read from stdin: sends it on ONE connection,
                                      prints "echo <line>" when the echo comes back (or
                                      "error <exception>" and exits if the connection breaks)
"""

from __future__ import annotations

import socket
import sys


def server(port: int) -> None:
    with socket.create_server(("0.0.0.0", port)) as srv:
        print("listening", flush=True)
        conn, _ = srv.accept()
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                    if not data:
                        print("closed", flush=True)
                        return
                    conn.sendall(data)
                except OSError as exc:
                    print(f"error {type(exc).__name__}: {exc}", flush=True)
                    return


def client(addr: str, port: int) -> None:
    with socket.create_connection((addr, port), timeout=10) as s:
        s.settimeout(60)
        print("connected", flush=True)
        for line in sys.stdin:
            msg = line.strip().encode() + b"\n"
            try:
                s.sendall(msg)
                got = b""
                while not got.endswith(b"\n"):
                    chunk = s.recv(65536)
                    if not chunk:
                        raise ConnectionError("closed by the peer")
                    got += chunk
            except OSError as exc:
                print(f"error {type(exc).__name__}: {exc}", flush=True)
                return
            print(f"echo {got.decode().strip()}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(int(sys.argv[2]))
    else:
        client(sys.argv[2], int(sys.argv[3]))
