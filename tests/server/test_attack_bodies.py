"""Unfinished request bodies against ``ratewarden serve`` as a real process on
loopback, with its default limits: HTTP/2 connections that open 4 streams
each, send as much of a gRPC request's body as the stream's window lets them
(all of it but the last byte), never END_STREAM, and stop.

What bounds them is the process's budget of unfinished request bytes
(``--max-buffered-bytes``, 32 MiB) with a stream's window its body's limit
(``--max-stream-bytes``, 256 KiB): past the budget the stream held longest is
answered RESOURCE_EXHAUSTED and its bytes are dropped. The server's RSS stays
within idle + the budget + ``SLACK`` while they hold, legitimate checks on
both listeners are answered meanwhile, and RSS comes back near idle once they
close. Each test prints one ``FIGURE`` line (run with ``-s``).
"""

from __future__ import annotations

import socket
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from ratewarden.server.h2._frames import PREFACE, frame
from tests.server.attack import GRPC_CHECK, service
from tests.server.h2.h2_attacks import (
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    RLS,
    legit_check,
    request_block,
    settings,
)
from tests.server.test_http_hostile import Legitimate, open_files, status_of

MiB = 1 << 20
BUDGET = 32 * MiB  # --max-buffered-bytes' default
STREAM_WINDOW = 256 * 1024  # --max-stream-bytes' default
STREAMS = 4  # a connection's unfinished requests
# what the process may use beyond idle and the budget: the connections
# themselves, the frames read before they are charged, the allocator's rounding
SLACK = 40 * MiB
# after the attackers close, freed memory is handed back to the system (the
# listener trims the heap at most every 5 s); what the allocator keeps is allowed
AFTER = 16 * MiB


def unfinished(port: int) -> socket.socket:
    """A connection with ``STREAMS`` requests that each sent all of a message
    but its last byte, exactly as much as the stream's window allows."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    length = STREAM_WINDOW - 5  # the message fits the window, 5 bytes of prefix with it
    body = (b"\x00" + length.to_bytes(4, "big") + b"\x00" * length)[:-1]
    out = [PREFACE, settings()]
    for sid in range(1, 2 * STREAMS, 2):
        out.append(frame(HEADERS, END_HEADERS, sid, request_block(RLS)))
        chunks = range(0, len(body), 16_384)  # the largest frame a peer must take
        out.extend(frame(DATA, 0, sid, body[at : at + 16_384]) for at in chunks)
    sock.sendall(b"".join(out))
    return sock


def answered(sock: socket.socket) -> int:
    """How many of the connection's requests the server has answered (their
    trailers, END_STREAM): those it shed, as none of them ended. What it sent
    is here already: read without waiting."""
    sock.setblocking(False)
    data = b""
    try:
        while chunk := sock.recv(1 << 16):
            data += chunk
    except OSError:  # BlockingIOError: all of it read
        pass
    count = at = 0
    while at + 9 <= len(data):
        length = int.from_bytes(data[at : at + 3], "big")
        if data[at + 3] == HEADERS and data[at + 4] & END_STREAM:
            count += 1
        at += 9 + length
    return count


def rss(pid: int) -> int:
    return status_of(pid)["VmRSS"] * 1024


def settle(pid: int, files: int, deadline: float) -> None:
    """Until the server has closed the attackers' connections (and ``deadline``)."""
    while open_files(pid) > files and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.parametrize("connections", [8, 200])
def test_unfinished_bodies_hold_no_more_than_the_budget(tmp_path: Path, connections: int) -> None:
    with service(tmp_path) as served:
        pid = served.process.pid
        files = open_files(pid)
        time.sleep(0.5)  # what the first checks freed is handed back, as it is later
        idle = rss(pid)
        legit = Legitimate(served.http)
        grpc_ms: list[float] = []
        peak = idle
        started = time.monotonic()
        with ExitStack() as stack:
            attackers = []
            for n in range(connections):
                attackers.append(stack.enter_context(unfinished(served.grpc)))
                if n % 25 == 24 or n == connections - 1:
                    # answered meanwhile, on both listeners
                    grpc_ms.append(legit_check(served.grpc, b"", GRPC_CHECK) * 1000)
                    assert legit.check() == 200
                    peak = max(peak, rss(pid))
            sent = time.monotonic() - started
            time.sleep(1.0)  # they hold
            for _ in range(3):
                grpc_ms.append(legit_check(served.grpc, b"", GRPC_CHECK) * 1000)
                assert legit.check() == 200
            holding = rss(pid)
            peak = max(peak, holding)
            assert holding <= idle + BUDGET + SLACK, (idle, holding)
            shed = sum(answered(sock) for sock in attackers)
            # the budget holds this many streams; those past it shed the oldest
            kept = BUDGET // STREAM_WINDOW
            assert shed >= connections * STREAMS - kept, shed
        settle(pid, files, time.monotonic() + 10)
        deadline = time.monotonic() + 8
        after = rss(pid)
        while after > idle + 2 * MiB and time.monotonic() < deadline:
            time.sleep(0.25)
            after = rss(pid)
        assert legit.check() == 200
        grpc_ms.append(legit_check(served.grpc, b"", GRPC_CHECK) * 1000)
        high = status_of(pid)["VmHWM"] * 1024
        print(f"\nFIGURE attack='{connections} connections x {STREAMS} unfinished bodies'"
              f" sent_mib={connections * STREAMS * STREAM_WINDOW / MiB:.0f} sent_s={sent:.1f}"
              f" rss_idle_mib={idle / MiB:.1f} rss_holding_mib={holding / MiB:.1f}"
              f" rss_peak_sampled_mib={peak / MiB:.1f} vm_hwm_mib={high / MiB:.1f}"
              f" rss_after_mib={after / MiB:.1f} streams_shed={shed}"
              f" legit_http={len(legit.statuses)}"
              f" legit_grpc={len(grpc_ms)} legit_grpc_worst_ms={max(grpc_ms):.1f}"
              f" legit_http_worst_ms={legit.worst_ms():.1f}")  # fmt: skip
        assert high <= idle + BUDGET + SLACK, (idle, high)
        assert after <= idle + AFTER, (idle, after)
