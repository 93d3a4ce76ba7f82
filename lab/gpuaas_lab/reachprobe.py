"""What a machine can reach, tried from the machine itself: the script a lab test runs in a
slice guest (over SSH, as `python3 -c SOURCE SPEC`) or in a lab namespace, to measure the
guest's containment (gpuaas_lab.containment). Standard library only, Python 3.10 or later:
it runs under the guest's own python3.

SPEC is JSON: {"timeout": seconds, "attempts": [...]}, each attempt one of

- {"name", "protocol": "tcp", "address", "port"}: a TCP connection; `connected` (with the
  first line the peer sent), `refused`, `timed out` or `unreachable`;
- {"name", "protocol": "udp", "address", "port"}: one datagram; `answered` (with the reply),
  `refused` (ICMP port unreachable), `unanswered` or `unreachable`;
- {"name", "protocol": "dns", "address", "query"}: an A query sent to that server's port
  53; `answered` (with the addresses), `nxdomain`, `refused`, `unanswered`;
- {"name", "protocol": "resolver", "query"}: the name looked up through the machine's
  own resolver configuration (what DHCP gave it); `answered` or `failed`;
- {"name", "protocol": "dhcp"}: the newest lease in the DHCP client's lease files;
  `leased` (with the address and the server) or `no lease`.

Every attempt runs at once, each bounded by the timeout. Prints one JSON list: each attempt
as given plus `result`, `reached` (the peer answered), `detail` and `seconds`.
"""

from __future__ import annotations

import errno
import glob
import json
import random
import re
import socket
import struct
import sys
import threading
import time

UNREACHABLE = {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EACCES, errno.EPERM}


def _failure(exc):
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, OSError) and exc.errno in UNREACHABLE:
        return "unreachable"
    return "error"


def _line(data):
    """The first line of what a peer sent, printable characters only (an SSH banner is
    followed by binary key exchange)."""
    first = data.decode(errors="replace").split("\n")[0]
    return "".join(c for c in first if c.isprintable()).strip()


def try_tcp(attempt, timeout):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect((attempt["address"], int(attempt["port"])))
    except OSError as exc:
        return _failure(exc), str(exc)
    try:
        first = _line(sock.recv(256))
    except OSError:
        first = ""
    finally:
        sock.close()
    return "connected", first


def try_udp(attempt, timeout):
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.settimeout(timeout)
    try:
        sock.connect((attempt["address"], int(attempt["port"])))
        sock.send(b"gpuaas-lab probe\n")
        reply = _line(sock.recv(512))
    except TimeoutError:
        return "unanswered", ""
    except OSError as exc:
        return _failure(exc), str(exc)
    finally:
        sock.close()
    return "answered", reply


def dns_query(name):
    ident = random.randint(0, 0xFFFF)
    question = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return ident, struct.pack(">HHHHHH", ident, 0x0100, 1, 0, 0, 0) + question + b"\0\1\0\1"


def _skip_name(data, offset):
    while True:
        length = data[offset]
        if length & 0xC0 == 0xC0:
            return offset + 2
        if length == 0:
            return offset + 1
        offset += 1 + length


def dns_answers(data, ident):
    """(rcode, [IPv4 addresses]) of a DNS response to the query `ident`."""
    got, flags, qdcount, ancount = struct.unpack(">HHHH", data[:8])
    if got != ident:
        raise ValueError("a response to another query")
    offset = 12
    for _ in range(qdcount):
        offset = _skip_name(data, offset) + 4
    addresses = []
    for _ in range(ancount):
        offset = _skip_name(data, offset)
        rtype, _, _, length = struct.unpack(">HHIH", data[offset : offset + 10])
        offset += 10
        if rtype == 1 and length == 4:
            addresses.append(socket.inet_ntoa(data[offset : offset + 4]))
        offset += length
    return flags & 0xF, addresses


def try_dns(attempt, timeout):
    ident, query = dns_query(attempt["query"])
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.settimeout(timeout)
    try:
        sock.connect((attempt["address"], int(attempt.get("port", 53))))
        sock.send(query)
        rcode, addresses = dns_answers(sock.recv(4096), ident)
    except TimeoutError:
        return "unanswered", ""
    except (OSError, ValueError, struct.error) as exc:
        return _failure(exc), str(exc)
    finally:
        sock.close()
    if rcode == 3:
        return "nxdomain", ""
    if rcode != 0:
        return "refused", f"rcode {rcode}"
    return "answered", ",".join(addresses)


def try_resolver(attempt, _timeout):
    try:
        infos = socket.getaddrinfo(attempt["query"], None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError as exc:
        return "failed", str(exc)
    return "answered", ",".join(sorted({info[4][0] for info in infos}))


def try_dhcp(_attempt, _timeout):
    newest = None
    for path in glob.glob("/var/lib/dhcp/*.leases"):
        with open(path, encoding="utf-8", errors="replace") as handle:
            for lease in re.findall(r"lease \{(.*?)\}", handle.read(), re.S):
                address = re.search(r"fixed-address ([0-9.]+);", lease)
                server = re.search(r"dhcp-server-identifier ([0-9.]+);", lease)
                if address:
                    newest = (address.group(1), server.group(1) if server else "")
    if newest is None:
        return "no lease", ""
    return "leased", f"{newest[0]} from {newest[1]}"


KINDS = {
    "tcp": try_tcp,
    "udp": try_udp,
    "dns": try_dns,
    "resolver": try_resolver,
    "dhcp": try_dhcp,
}
REACHED = {"connected", "answered", "leased"}


def run(spec):
    timeout = float(spec.get("timeout", 3))
    results = [None] * len(spec["attempts"])

    def one(index, attempt):
        started = time.monotonic()
        try:
            result, detail = KINDS[attempt["protocol"]](attempt, timeout)
        except Exception as exc:  # a probe's own failure is a result, not a crash
            result, detail = "error", f"{type(exc).__name__}: {exc}"
        results[index] = dict(
            attempt,
            result=result,
            reached=result in REACHED,
            detail=detail,
            seconds=round(time.monotonic() - started, 3),
        )

    threads = [threading.Thread(target=one, args=(i, a)) for i, a in enumerate(spec["attempts"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))))
