"""Slowloris over HTTP from one address against ``ratewarden serve`` as a real
process on loopback: 1,000 connections (``--max-connections-per-peer``'s
default, every slot the address has) that each begin a request and drip its
head a byte at a time, reopened when the server closes them, while a
legitimate client from the same address checks on new connections.

At the address's cap the server closes the connection whose request has been
arriving longest, once past ``--partial-grace`` (1 s), to admit the new one:
every legitimate check is answered. The header timeout is raised to 60 s, so
that it is the cap's choice that answers them, not the timeout that would end
the slow heads 10 s in. Prints one ``FIGURE`` line (run with ``-s``).
"""

from __future__ import annotations

import socket
import time
from collections import deque
from pathlib import Path

import pytest

from tests.server.attack import service
from tests.server.test_http_hostile import Legitimate

ATTACK = 1_000  # --max-connections-per-peer's default
HEAD = (b"POST /v1/check HTTP/1.1\r\nhost: ratewarden\r\ncontent-type: application/json\r\n"
        b"content-length: 64\r\nx-slow: " + b"z" * 4000)  # fmt: skip
GRACE = 1.0  # --partial-grace's default
CHECKS = 60  # legitimate checks during the attack, 3 a round of drips
LATE = 5.0


def slow(port: int) -> socket.socket:
    """A connection whose request has begun (its first byte), never to end."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=LATE)
    sock.sendall(HEAD[:1])
    sock.setblocking(False)
    return sock


def drip(sock: socket.socket, sent: int) -> bool:
    """Byte ``sent`` of the head; False if the server has closed it."""
    try:
        if sock.recv(1 << 16) == b"":
            return False
    except BlockingIOError:
        pass
    except OSError:
        return False
    try:
        sock.send(HEAD[sent : sent + 1])
    except BlockingIOError:
        pass
    except OSError:
        return False
    return True


@pytest.mark.parametrize("churn", [0, 500], ids=["steady", "churning"])
def test_1000_slow_heads_from_one_address_leave_its_checks_answered(
    tmp_path: Path, churn: int
) -> None:
    """``churning``: each round the attacker also drops its 500 oldest and opens
    them again, about 5,000 new connections a second: every one of its
    connections stays younger than the grace, and its own newcomers still get in."""
    with service(tmp_path, "--header-timeout", "60") as served:
        legit = Legitimate(served.http)
        held: deque[tuple[socket.socket, int]] = deque()  # and the bytes of its head sent
        reopened = most = 0
        try:
            for _ in range(ATTACK):
                held.append((slow(served.http), 1))
            first_round = time.monotonic()
            time.sleep(GRACE + 0.2)  # the oldest heads are past the grace now
            started = time.monotonic()
            while len(legit.statuses) < CHECKS:
                for _ in range(churn):  # the oldest dropped and opened again
                    held.popleft()[0].close()
                    held.append((slow(served.http), 1))
                    reopened += 1
                for _ in range(len(held)):  # a byte each, and the closed ones opened again
                    sock, sent = held.popleft()
                    if drip(sock, sent):
                        held.append((sock, sent + 1))
                        most = max(most, sent + 1)
                    else:
                        sock.close()
                        held.append((slow(served.http), 1))
                        reopened += 1
                for _ in range(3):
                    legit.check()
                time.sleep(0.1)
            took = time.monotonic() - started
        finally:
            for sock, _ in held:
                sock.close()
        assert legit.statuses == [200] * CHECKS, legit.statuses
        assert most < len(HEAD)  # every head was still arriving throughout
        assert time.monotonic() - first_round < 60  # the header timeout closed none
        print(f"\nFIGURE attack='{ATTACK} slow heads from one address, HTTP, churn {churn}'"
              f" legit_checks={CHECKS} answered_200={legit.statuses.count(200)}"
              f" worst_ms={legit.worst_ms():.0f} reopened={reopened}"
              f" took_s={took:.1f}")  # fmt: skip
