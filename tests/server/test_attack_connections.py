"""20,000 idle connections from one address against ``ratewarden serve`` as a
real process on loopback, with its default limits: 10,000 on each port (the
HTTP ones send nothing, the HTTP/2 ones the preface and SETTINGS), while a
legitimate client checks on new connections on both ports, from the same
address and from another one (127.0.0.2).

One address keeps at most ``--max-connections-per-peer`` (1,000) connections
a listener: each new one closes the address's own connection idle longest (an
HTTP close, an HTTP/2 GOAWAY NO_ERROR), so a flood from one address cannot
take the slots of ``--max-connections`` from everyone else, and a legitimate
client's new connection takes the place of an idle one instead of being
refused.

This machine's open-file limit is 20,000 (soft and hard), for the test and the
server alike: the test closes each connection the server closed, so it holds
about 1,100 a port, and the server at most 1,000 a port from the attacker.
Prints one ``FIGURE`` line (run with ``-s``).
"""

from __future__ import annotations

import socket
import time
from collections import deque
from pathlib import Path

from ratewarden.server.h2._frames import PREFACE
from tests.server.attack import GRPC_CHECK, service
from tests.server.h2.h2_attacks import legit_check, settings
from tests.server.test_http_hostile import (
    CHECK,
    Legitimate,
    open_files,
    read_answer_once,
    status_of,
)

ATTACK = 20_000  # connections in all, half a port
PER_PEER = 1_000  # --max-connections-per-peer's default
# connections the test keeps open a port: the server's 1,000 and those it may
# not have accepted yet; any older must have been closed by the server
KEPT = PER_PEER + 100
LATE = 5.0  # how long the server may take to close one (a loaded machine)
MiB = 1 << 20


def idle(port: int, first: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=LATE)
    if first:
        sock.sendall(first)
    sock.setblocking(False)
    return sock


def closed_by_server(sock: socket.socket, deadline: float) -> bool:
    """Whether the server closes it by ``deadline`` (what it said first is dropped)."""
    while True:
        try:
            while sock.recv(1 << 16):
                pass
            return True  # b"": closed
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.002)
        except ConnectionResetError:
            return True


def http_check_from(port: int, source: str) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=LATE,
                                  source_address=(source, 0)) as sock:  # fmt: skip
        sock.sendall(CHECK)
        answer = read_answer_once(sock)
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def test_20000_idle_connections_from_one_address_leave_room_for_others(tmp_path: Path) -> None:
    with service(tmp_path) as served:
        pid = served.process.pid
        files = open_files(pid)
        rss_idle = status_of(pid)["VmRSS"]
        legit = Legitimate(served.http)
        grpc_answers = http_other = 0
        most_files = files
        ports = ((served.http, b""), (served.grpc, PREFACE + settings()))
        held: dict[int, deque[socket.socket]] = {port: deque() for port, _ in ports}
        opened = closed = 0
        started = time.monotonic()
        try:
            while opened < ATTACK:
                for port, first in ports:
                    held[port].append(idle(port, first))
                    opened += 1
                    while len(held[port]) > KEPT:
                        oldest = held[port].popleft()
                        assert closed_by_server(oldest, time.monotonic() + LATE), opened
                        oldest.close()
                        closed += 1
                if opened % 1_000 == 0:  # a legitimate client, throughout
                    assert legit.check() == 200  # from the attacker's address
                    assert http_check_from(served.http, "127.0.0.2") == 200
                    http_other += 1
                    legit_check(served.grpc, b"", GRPC_CHECK)
                    grpc_answers += 1
                    most_files = max(most_files, open_files(pid))
            took = time.monotonic() - started
            rss_attack = status_of(pid)["VmRSS"]
            # the server holds the address's newest 1,000 a port, and no more
            assert most_files <= files + 2 * PER_PEER + 10, most_files
            for port, _ in ports:
                newest = held[port][-1]
                assert not closed_by_server(newest, time.monotonic() + 0.05)
        finally:
            for sockets in held.values():
                for sock in sockets:
                    sock.close()
        assert legit.check() == 200
        legit_check(served.grpc, b"", GRPC_CHECK)
        memory = status_of(pid)
        print(f"\nFIGURE attack='{ATTACK} idle connections from one address, both ports'"
              f" opened={opened} closed_by_server={closed} took_s={took:.1f}"
              f" server_files_max={most_files} (idle {files})"
              f" rss_idle_mib={rss_idle / 1024:.1f} rss_attack_mib={rss_attack / 1024:.1f}"
              f" rss_after_mib={memory['VmRSS'] / 1024:.1f} vm_hwm_mib={memory['VmHWM'] / 1024:.1f}"
              f" legit_http_same_address={len(legit.statuses)} legit_http_other={http_other}"
              f" legit_grpc={grpc_answers + 1} legit_5xx={legit.errors}")  # fmt: skip
        assert opened == ATTACK
