"""Hostile clients of the HTTP listener, against ``ratewarden serve`` as a real
process on loopback with small limits (``--max-connections``, the timeouts,
``--max-header-bytes``), each attack bounded in time.

Each test checks what the attack is refused with and that a legitimate check
still gets through while it runs, and prints one ``FIGURE`` line (run with
``-s``): the server's peak RSS (VmHWM), the latency of a legitimate check
during the attack, and the 5xx answers legitimate checks got.
"""

from __future__ import annotations

import asyncio
import socket
import textwrap
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.server.process import Served, serving

RULES = textwrap.dedent("""
    rules:
      - name: per-user
        rate: 1000000/minute
        by: user
""")
CHECK_BODY = b'{"attributes": {"user": "legitimate", "path": "/api/x"}}'
CHECK = (b"POST /v1/check HTTP/1.1\r\nhost: ratewarden\r\ncontent-type: application/json\r\n"
         b"content-length: %d\r\n\r\n%s" % (len(CHECK_BODY), CHECK_BODY))  # fmt: skip

# small limits, so that every attack ends in a second or two
IDLE, HEADER, BODY = 2.0, 1.0, 1.0
LIMITS = ("--max-connections", "50", "--idle-timeout", str(IDLE), "--header-timeout",
          str(HEADER), "--body-timeout", str(BODY), "--max-header-bytes", "8192")  # fmt: skip
# a timeout fires within a sweep (a quarter of the shortest timeout) of its time;
# the rest is room for a loaded test machine
LATE = 2.0


def status_of(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (the peak) of a process, in KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(value.split()[0])
    return out


def open_files(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def connect(port: int, timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_answer(sock: socket.socket, deadline: float) -> bytes:
    """Everything until the server closes, or ``deadline`` (time.monotonic())."""
    chunks = []
    try:
        while True:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    except (TimeoutError, ConnectionResetError):
        pass
    return b"".join(chunks)


def closed_after(sock: socket.socket, deadline: float) -> tuple[bytes, float]:
    """What the server sends until it closes (or ``deadline``), and how long
    that took: every attack ends within a bound, the limits working or not."""
    started = time.monotonic()
    answer = read_answer(sock, deadline)
    return answer, time.monotonic() - started


@dataclass
class Legitimate:
    """A legitimate client checking on new connections while an attack runs."""

    port: int
    latencies: list[float] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)

    def check(self) -> int:
        started = time.monotonic()
        with connect(self.port) as sock:
            sock.sendall(CHECK)
            answer = read_answer_once(sock)
        self.latencies.append(time.monotonic() - started)
        status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0
        self.statuses.append(status)
        return status

    @property
    def errors(self) -> int:
        return sum(1 for s in self.statuses if s == 0 or s >= 500)

    def worst_ms(self) -> float:
        return max(self.latencies, default=0.0) * 1000


def read_answer_once(sock: socket.socket) -> bytes:
    """One answer with a Content-Length, on a connection that stays open."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def figure(attack: str, served: Served, legit: Legitimate, **more: object) -> None:
    memory = status_of(served.process.pid)
    extra = "".join(f" {k}={v}" for k, v in more.items())
    print(f"\nFIGURE attack={attack!r} peak_rss_kib={memory['VmHWM']} rss_kib={memory['VmRSS']}"
          f" legit_checks={len(legit.statuses)} legit_worst_ms={legit.worst_ms():.1f}"
          f" legit_5xx={legit.errors}{extra}")  # fmt: skip


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    return path


@contextmanager
def service(rules: Path, tmp: Path, *more: str) -> Iterator[Served]:
    with serving("--config", str(rules), *LIMITS, *more, tmp=tmp) as served:
        Legitimate(served.http).check()  # warm: the first check imports and compiles
        yield served
        assert served.terminate() == 0


def test_idle_connections_beyond_the_cap_make_room_oldest_first(
    rules: Path, tmp_path: Path
) -> None:
    """At --max-connections a new connection takes the place of the one idle
    longest: a flood of idle connections closes its own oldest one by one, the
    descriptors stay at the cap, and a legitimate check is answered 200
    throughout, on HTTP and on gRPC (a listener of its own)."""
    from tests.server.test_serve import grpc_check  # noqa: PLC0415

    with service(rules, tmp_path, "--idle-timeout", "30") as served, ExitStack() as stack:
        pid = served.process.pid
        files_before = open_files(pid)
        legit = Legitimate(served.http)
        held = deque(stack.enter_context(connect(served.http)) for _ in range(50))
        flood_started = time.monotonic()
        for newcomer in range(300):
            sock = stack.enter_context(connect(served.http))
            if newcomer % 50 == 0:  # a legitimate client's, kept open after its answer
                started = time.monotonic()
                sock.sendall(CHECK)
                answer = read_answer_once(sock)
                legit.latencies.append(time.monotonic() - started)
                legit.statuses.append(200 if answer.startswith(b"HTTP/1.1 200 ") else 0)
            held.append(sock)
            oldest = held.popleft()  # closed to make room, and no other
            answer, took = closed_after(oldest, time.monotonic() + LATE)
            assert answer == b""
            assert took < LATE
        took = time.monotonic() - flood_started
        assert legit.statuses == [200] * 6
        assert open_files(pid) <= files_before + 50 + 5
        assert grpc_check(served.grpc, "192.0.2.1") == 1  # the other listener: not starved
        assert legit.check() == 200  # and HTTP on a new connection, at the cap
        held.popleft()
        for sock in list(held)[-10:]:  # the newest are still open
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                sock.recv(1)
        figure("350 idle connections, cap 50", served, legit, evicted=300,
               evictions_per_s=round(300 / took), open_files_max=files_before + 50)  # fmt: skip


def test_connections_beyond_the_cap_are_refused_when_none_is_idle(
    rules: Path, tmp_path: Path
) -> None:
    """With every one of --max-connections busy (a body still arriving, within
    --partial-grace: none may be closed for a newcomer), one more is answered
    503 at once; gRPC (a listener of its own) still answers, and HTTP answers
    again once the busy ones are gone. (tests/server/test_attack_slowloris.py:
    past the grace, a newcomer takes a slow one's place.)"""
    from tests.server.test_serve import grpc_check  # noqa: PLC0415

    slow = ("--body-timeout", "10", "--idle-timeout", "10", "--partial-grace", "30")
    with service(rules, tmp_path, *slow) as served, ExitStack() as stack:
        pid = served.process.pid
        files_before = open_files(pid)
        legit = Legitimate(served.http)
        head = (b"POST /v1/check HTTP/1.1\r\nhost: ratewarden\r\nexpect: 100-continue\r\n"
                b"content-length: %d\r\n\r\n" % len(CHECK_BODY))  # fmt: skip
        held = []
        for _ in range(50):
            sock = stack.enter_context(connect(served.http))
            sock.sendall(head)
            # the app asked for the body: the server has read the head, the connection is busy
            assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
            sock.sendall(CHECK_BODY[:5])
            held.append(sock)
        flood_started = time.monotonic()
        refused = 0
        while refused < 1000 and time.monotonic() - flood_started < 2:
            with connect(served.http) as extra:
                answer, took = closed_after(extra, time.monotonic() + LATE)
            assert answer.startswith(b"HTTP/1.1 503 "), answer
            assert took < LATE
            refused += 1
        flood = time.monotonic() - flood_started
        assert open_files(pid) <= files_before + 50 + 5
        assert grpc_check(served.grpc, "192.0.2.1") == 1  # the other listener: not starved
        assert legit.check() == 503  # the cap is the cap
        for sock in held[:10]:  # their bodies end: answered, then idle, they make room
            sock.sendall(CHECK_BODY[5:])
            assert read_answer_once(sock).startswith(b"HTTP/1.1 200 ")
        assert legit.check() == 200
        figure(f"{50 + refused} connections, 50 busy, cap 50", served, legit, refused=refused,
               refusals_per_s=round(refused / flood), open_files_max=files_before + 50)  # fmt: skip


def test_a_flood_of_idle_connections_is_closed_by_the_idle_timeout(
    rules: Path, tmp_path: Path
) -> None:
    with service(rules, tmp_path) as served, ExitStack() as stack:
        legit = Legitimate(served.http)
        idle = [stack.enter_context(connect(served.http)) for _ in range(20)]
        kept = stack.enter_context(connect(served.http))  # idle after one request
        kept.sendall(CHECK)
        assert read_answer_once(kept).startswith(b"HTTP/1.1 200 ")
        started = time.monotonic()
        for _ in range(5):
            assert legit.check() == 200
        for sock in [*idle, kept]:
            answer, _ = closed_after(sock, started + IDLE + LATE)
            assert answer == b""
        took = time.monotonic() - started
        assert IDLE - 0.5 < took < IDLE + LATE
        figure("21 idle connections", served, legit, closed_after_s=round(took, 2))


def test_a_slow_sender_of_headers_is_answered_408(rules: Path, tmp_path: Path) -> None:
    with service(rules, tmp_path) as served, ExitStack() as stack:
        legit = Legitimate(served.http)
        slow = [stack.enter_context(connect(served.http)) for _ in range(20)]
        stop = threading.Event()

        def drip() -> None:  # one byte a connection every 0.1 s: never a whole head
            head = b"GET /healthz HTTP/1.1\r\nx-slow: " + b"a" * 1000
            for byte in head:
                for sock in slow:
                    with suppress(OSError):
                        sock.send(bytes([byte]))
                if stop.wait(0.1):
                    return

        dripping = threading.Thread(target=drip)
        started = time.monotonic()
        dripping.start()
        try:
            while time.monotonic() - started < HEADER / 2:
                assert legit.check() == 200
            answers = [closed_after(sock, started + HEADER + LATE)[0] for sock in slow]
            took = time.monotonic() - started
        finally:
            stop.set()
            dripping.join()
        assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers), answers[0]
        assert b"headers did not arrive in time" in answers[0]
        assert HEADER - 0.2 < took < HEADER + LATE
        figure("20 header senders, a byte each 0.1 s", served, legit,
               answered_408_after_s=round(took, 2))  # fmt: skip


@pytest.mark.parametrize("how", ["short", "slow"])
def test_a_body_that_does_not_arrive_is_answered_408(rules: Path, tmp_path: Path, how: str) -> None:
    """A body shorter than its Content-Length, or one sent a byte at a time, is
    answered 408 at the body timeout, not waited on for ever."""
    with service(rules, tmp_path) as served, ExitStack() as stack:
        legit = Legitimate(served.http)
        head = (b"POST /v1/check HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: 1000\r\n\r\n{")  # fmt: skip
        socks = [stack.enter_context(connect(served.http)) for _ in range(20)]
        started = time.monotonic()
        for sock in socks:
            sock.sendall(head)
        stop = threading.Event()

        def drip() -> None:
            while not stop.wait(0.1):
                for sock in socks:
                    with suppress(OSError):
                        sock.send(b" ")

        dripping = threading.Thread(target=drip)
        if how == "slow":
            dripping.start()
        try:
            for _ in range(5):
                assert legit.check() == 200
            answers = [closed_after(sock, started + BODY + LATE)[0] for sock in socks]
            took = time.monotonic() - started
        finally:
            stop.set()
            if how == "slow":
                dripping.join()
        assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers), answers[0]
        assert b"body did not arrive in time" in answers[0]
        assert BODY - 0.2 < took < BODY + LATE
        figure(f"20 bodies ({how}) of a promised 1000 bytes", served, legit,
               answered_408_after_s=round(took, 2))  # fmt: skip


def test_a_huge_head_is_431_and_memory_stays_flat(rules: Path, tmp_path: Path) -> None:
    """An unfinished 20 MiB header once held 257 MiB: now its first 8 KiB (and
    one read past them) are all the server keeps before it answers 431."""
    with service(rules, tmp_path) as served:
        pid = served.process.pid
        legit = Legitimate(served.http)
        before = status_of(pid)["VmRSS"]
        answers = []
        for _ in range(5):
            with connect(served.http) as sock:
                stop = threading.Event()
                sent = [0]

                def flood(sock: socket.socket = sock, stop: threading.Event = stop,
                          sent: list[int] = sent) -> None:  # fmt: skip
                    sock.sendall(b"GET /healthz HTTP/1.1\r\nx-huge: ")
                    chunk = b"a" * 65536
                    try:
                        while not stop.is_set() and sent[0] < 20 << 20:
                            sock.sendall(chunk)
                            sent[0] += len(chunk)
                    except OSError:
                        pass

                flooding = threading.Thread(target=flood)
                flooding.start()
                try:
                    assert legit.check() == 200
                    answer, _ = closed_after(sock, time.monotonic() + LATE)
                finally:
                    stop.set()
                    flooding.join()
                answers.append(answer)
                assert sent[0] >= 1 << 20 or answer  # 1 MiB went, or the answer came first
        after = status_of(pid)
        assert all(a.startswith(b"HTTP/1.1 431 ") for a in answers), answers[0][:200]
        assert b"larger than 8192 bytes" in answers[0]
        grown = after["VmHWM"] - before
        assert grown < 8 * 1024, f"peak RSS grew by {grown} KiB"
        figure("5 heads of up to 20 MiB", served, legit, peak_growth_kib=grown)


def test_a_body_with_endless_trailers_is_413(rules: Path, tmp_path: Path) -> None:
    """A chunked body's trailers are headers the parser keeps in memory: the
    whole body, trailers and all, is bounded by --max-body and the head limit."""
    with service(rules, tmp_path, "--max-body", "1024") as served, connect(served.http) as sock:
        legit = Legitimate(served.http)
        sock.sendall(b"POST /v1/check HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
                     b"2\r\n{}\r\n0\r\nx-trailer: ")  # fmt: skip
        with suppress(OSError):  # more than one read's worth: a read is counted whole
            for _ in range(1024):
                sock.sendall(b"t" * 1024)
        answer, _ = closed_after(sock, time.monotonic() + BODY + LATE)
        assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
        assert legit.check() == 200
        figure("a chunked body with an endless trailer", served, legit)


def test_a_client_that_reads_no_answers_is_dropped(rules: Path, tmp_path: Path) -> None:
    """Requests sent one after another, their answers (the 15 KB OpenAPI
    document) never read, fill the sockets' buffers and then the server's: once
    its writes stall, the connection has the idle timeout."""
    with service(rules, tmp_path) as served:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", served.http))
        legit = Legitimate(served.http)
        started = time.monotonic()
        sent = 0
        with sock, suppress(OSError):
            while time.monotonic() - started < 30:
                sock.sendall(b"GET /openapi.json HTTP/1.1\r\nhost: x\r\n\r\n")
                sent += 1
                if sent % 100 == 0:
                    assert legit.check() == 200
                time.sleep(0.002)  # slower than the answers: no queue, only unread answers
        took = time.monotonic() - started
        assert took < 30, "still open"
        figure("answers never read", served, legit, sent=sent, dropped_after_s=round(took, 2))


def test_more_than_max_pipelined_requests_close_the_connection(rules: Path, tmp_path: Path) -> None:
    """One read can hold thousands of pipelined requests (and their memory):
    more than MAX_PIPELINED waiting ends the connection."""
    from ratewarden.server._http import MAX_PIPELINED  # noqa: PLC0415

    with service(rules, tmp_path) as served:
        pid = served.process.pid
        legit = Legitimate(served.http)
        before = status_of(pid)["VmRSS"]
        with connect(served.http) as sock, suppress(OSError):
            for _ in range(200):
                sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n" * 1000)
        with connect(served.http) as sock:  # a few pipelined: answered in order
            sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n" * (MAX_PIPELINED // 2))
            answers = b""
            while answers.count(b"HTTP/1.1 200 ") < MAX_PIPELINED // 2:
                answers += sock.recv(65536)
        assert legit.check() == 200
        grown = status_of(pid)["VmHWM"] - before
        assert grown < 16 * 1024, f"peak RSS grew by {grown} KiB"
        figure("200,000 pipelined requests on one connection", served, legit,
               peak_growth_kib=grown)  # fmt: skip


class FakeTransport(asyncio.Transport):
    """Enough of a transport for the protocol, in process: what was written,
    and whether it was closed or dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = self.aborted = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8080)}.get(name)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 1 << 20  # the client reads nothing

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


@pytest.mark.parametrize("stalled", [False, True])
def test_a_request_in_flight_is_dropped_only_when_its_answer_stalls(stalled: bool) -> None:
    """While the app answers there is no deadline (a delay rule may hold a
    request); once the client takes none of our writes, the idle timeout runs."""
    from ratewarden.server._connection_limits import ConnectionLimits  # noqa: PLC0415
    from ratewarden.server._http import HttpConnection  # noqa: PLC0415
    from ratewarden.server._http_listener import HttpListener  # noqa: PLC0415

    async def holding(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.Event().wait()  # an answer that takes its time

    async def main() -> FakeTransport:
        limits = ConnectionLimits(idle_timeout=0.2, header_timeout=0.2, body_timeout=0.2)
        protocol = HttpConnection(HttpListener(limits, 65536), holding)
        transport = FakeTransport()
        protocol.connection_made(transport)
        protocol.data_received(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
        if stalled:
            protocol.pause_writing()
        await asyncio.sleep(0.6)
        protocol.connection_lost(None)
        if protocol.task is not None:
            protocol.task.cancel()
        return transport

    transport = asyncio.run(main())
    assert transport.aborted is stalled
    assert transport.written == b""
