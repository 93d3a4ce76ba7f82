"""A stand-in service for lab tests: listens on one TCP or UDP address and answers each
connection (or datagram) with one line naming itself, so a probe knows which stand-in it
reached, and not merely that something answered. Started inside a lab namespace and
stopped by pid (gpuaas_lab.containment):

    python -m gpuaas_lab.standin store-postgresql tcp 10.20.0.5 5432

It prints `listening` once bound. Standard library only.
"""

from __future__ import annotations

import contextlib
import socket
import sys


def banner(name: str) -> bytes:
    return f"gpuaas-lab {name}\n".encode()


def serve(name: str, protocol: str, address: str, port: int) -> None:
    line = banner(name)
    if protocol == "tcp":
        server = socket.create_server((address, port), backlog=64)
        print("listening", flush=True)
        while True:
            conn, _ = server.accept()
            with conn, contextlib.suppress(OSError):
                conn.sendall(line)
    elif protocol == "udp":
        server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        server.bind((address, port))
        print("listening", flush=True)
        while True:
            _, peer = server.recvfrom(4096)
            server.sendto(line, peer)
    else:
        raise SystemExit(f"protocol must be tcp or udp, not {protocol}")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit("usage: python -m gpuaas_lab.standin NAME tcp|udp ADDRESS PORT")
    serve(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
