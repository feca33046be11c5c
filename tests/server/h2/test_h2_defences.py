"""What a hostile client can make the HTTP/2 server spend: each defence of
`ratewarden.server.h2` (`_connection` and the layers it is built on) attacked on
its own, in process, with small limits."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import h2.settings
import pytest

from ratewarden.server._connection_limits import BodyBudget, ConnectionLimits, ServerLimits
from ratewarden.server.h2 import _send
from ratewarden.server.h2._frames import PREFACE, frame, literal
from ratewarden.server.h2._grpc import MAX_STREAMING, Call, H2Server, Metadata, Method, Status
from tests.server.h2.h2_attacks import message, request_block
from tests.server.h2.test_h2 import client, frames_of, goaway_code

CALM, NO_ERROR, COMPRESSION = 0xB, 0x0, 0x9
HEADERS, DATA, CONT, SETTINGS, RST = 1, 0, 9, 4, 3


async def echo(request: bytes, metadata: Metadata) -> bytes:
    return request


async def big(request: bytes, metadata: Metadata) -> bytes:
    return b"x" * int(request)


STATE: dict[str, Any] = {}


async def talk(call: Call) -> None:
    """Answers each message with 1,000 bytes, counting what it sent."""
    STATE["sent"] = 0
    try:
        while (await call.recv()) is not None:
            await call.send(b"a" * 1000)
            STATE["sent"] += 1
    except asyncio.CancelledError:
        STATE["cancelled"] = time.monotonic()
        raise


async def hold(call: Call) -> None:
    while (await call.recv()) is not None:
        pass


METHODS = {
    "/t.T/Echo": Method("unary", echo),
    "/t.T/Big": Method("unary", big),
    "/t.T/Talk": Method("streaming", talk),
    "/t.T/Hold": Method("streaming", hold),
}


@asynccontextmanager
async def serving(
    token: bytes | None = None, server_limits: ServerLimits | None = None, **limits: Any
) -> AsyncIterator[tuple[H2Server, int]]:
    # a budget of its own: the process's is shared with every other test's server
    budget = BodyBudget((server_limits or ServerLimits()).max_buffered_bytes)
    server = H2Server(METHODS, token=token, limits=ConnectionLimits(**limits),
                      server_limits=server_limits, budget=budget)  # fmt: skip
    port = await server.listen("127.0.0.1", 0)
    try:
        yield server, port
    finally:
        await server.stop(0)


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def send_and_read(port: int, data: bytes, *, wait: float = 5.0) -> bytes:
    """Sends the preface, SETTINGS and ``data``; what the server said until it
    closed (or ``wait`` passed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(PREFACE + frame(SETTINGS, 0, 0, b"") + data)
        out = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                out += chunk
        return out


async def exchange(port: int, data: bytes, *, wait: float = 5.0) -> bytes:
    return await asyncio.to_thread(send_and_read, port, data, wait=wait)


# -- the budget of frames that make no progress, and of resets -------------------------

HEAD = frame(HEADERS, 0x4, 1, request_block(b"/t.T/Echo"))
NO_PROGRESS = {
    "empty CONTINUATION": frame(HEADERS, 0, 1, request_block(b"/t.T/Echo"))
    + frame(CONT, 0, 1, b"") * 1100,
    "empty DATA": HEAD + frame(DATA, 0, 1, b"") * 1100,
    "unknown type": frame(0x42, 0, 0, b"") * 1100,
    "PRIORITY": frame(2, 0, 1, b"\0\0\0\0\x10") * 1100,
    "PING": frame(6, 0, 0, bytes(8)) * 1100,
    "SETTINGS": frame(SETTINGS, 0, 0, b"") * 1100,
    "WINDOW_UPDATE on a closed stream": (
        HEAD + frame(RST, 0, 1, bytes(4)) + frame(8, 0, 1, b"\0\0\0\x01") * 1100
    ),
    # WINDOW_UPDATE of 0 on an open stream: the server resets it; 1,100 streams
    "server resets": b"".join(
        frame(HEADERS, 0x4, s, request_block(b"/t.T/Echo")) + frame(8, 0, s, bytes(4))
        for s in range(1, 2201, 2)
    ),
    "client resets": b"".join(
        frame(HEADERS, 0x4, s, request_block(b"/t.T/Echo")) + frame(RST, 0, s, b"\0\0\0\x08")
        for s in range(1, 2201, 2)
    ),
    "SETTINGS of 2,730 entries": frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 65_535) * 2730) * 4,
}


@pytest.mark.parametrize("data", NO_PROGRESS.values(), ids=NO_PROGRESS.keys())
def test_frames_that_make_no_progress_end_the_connection(data: bytes) -> None:
    async def main() -> None:
        async with serving() as (server, port):
            said = await exchange(port, data)
            assert server.calmed == 1
        assert goaway_code(said) == CALM

    run(main)


def test_calls_refused_cost_credit_too() -> None:
    unauthenticated = b"".join(frame(HEADERS, 0x5, s, request_block(b"/t.T/Echo"))
                               for s in range(1, 2201, 2))  # fmt: skip

    async def main() -> None:
        async with serving(token=b"secret") as (_, port):
            said = await exchange(port, unauthenticated)
        assert goaway_code(said) == CALM

    run(main)


def test_a_busy_well_behaved_client_spends_nothing() -> None:
    async def main() -> None:
        async with serving() as (server, port), client(port) as c:
            for _ in range(30):  # 2,700 calls, 90 at a time
                sids = [c.start("/t.T/Echo", message(b"%d" % i)) for i in range(90)]
                answers = [await c.answer(sid) for sid in sids]
                assert {a.status for a in answers} == {Status.OK}
            assert server.calmed == 0
            assert not c.closed.is_set()

    run(main)


# -- windows ------------------------------------------------------------------------------


def test_initial_window_size_moves_the_windows_of_open_streams() -> None:
    async def main() -> None:
        settings = {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0}
        async with serving() as (_, port), client(port, settings) as c:
            sid = c.start("/t.T/Big", message(b"5000"))
            await asyncio.sleep(0.2)
            assert not c.done[sid].is_set()  # no window: nothing can be sent
            c.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 3000})
            c.flush()
            answer = await c.answer(sid)  # the open stream's window moved from 0
        assert answer.messages == [b"x" * 5000]

    run(main)


def test_answers_wait_for_a_client_that_does_not_read() -> None:
    async def main() -> None:
        settings = {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0}
        async with serving() as (server, port), client(port, settings) as c:
            c.start("/t.T/Talk", message(b"go") * 2000, end=False)
            await asyncio.sleep(0.5)
            (connection,) = server.connections
            # the handler stopped at the queue's bound instead of answering all 2,000
            assert STATE["sent"] < 40
            assert connection.queued <= _send.STREAM_QUEUE + 1005

    run(main)


def test_a_client_that_never_reads_its_answers_ends_the_call() -> None:
    async def main() -> None:
        settings = {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0}
        async with serving(idle_timeout=0.3) as (_, port), client(port, settings) as c:
            sid = c.start("/t.T/Talk", message(b"go") * 100, end=False)
            # the window stays shut: the status comes all the same, ahead of the
            # answers it could not send (trailers are not flow-controlled)
            answer = await c.answer(sid)
        assert answer.status == Status.RESOURCE_EXHAUSTED
        assert answer.message == b"the client reads no answers"

    run(main)


def test_streaming_calls_a_connection_may_hold() -> None:
    async def main() -> None:
        async with serving() as (_, port), client(port) as c:
            open_ = [c.start("/t.T/Hold", message(b"x"), end=False) for _ in range(MAX_STREAMING)]
            refused = await c.call("/t.T/Hold", message(b"x"))
            assert refused.status == Status.RESOURCE_EXHAUSTED
            await c.send(open_[0], b"", end=True)  # one ends: room for another
            assert (await c.answer(open_[0])).status == Status.OK
            sid = c.start("/t.T/Hold", message(b"x"))
            assert (await c.answer(sid)).status == Status.OK

    run(main)


def test_calls_of_a_failed_connection_stop_at_once() -> None:
    async def main() -> None:
        async with serving() as (_, port):
            STATE.pop("cancelled", None)
            start_talk = frame(HEADERS, 0x4, 1, request_block(b"/t.T/Talk"))
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(PREFACE + frame(SETTINGS, 0, 0, b"") + start_talk)
                await asyncio.sleep(0.1)
                failed = time.monotonic()
                sock.sendall(frame(DATA, 0, 0, b"x"))  # DATA on stream 0: a connection error
                await asyncio.sleep(0.3)
                # cancelled well before the lingering close (1 s) ends the connection
                assert STATE.get("cancelled", failed + 10) - failed < 0.3

    run(main)


# -- headers ------------------------------------------------------------------------------


def _server_settings(data: bytes) -> dict[int, int]:
    for kind, flags, _, payload in frames_of(data):
        if kind == SETTINGS and not flags & 1:
            return dict(struct.iter_unpack(">HI", payload))
    raise AssertionError("no SETTINGS")


def test_the_header_list_limit_is_advertised_and_enforced_on_the_decoded_size() -> None:
    value = b"v" * 3000  # stored once in the dynamic table, then referenced
    insert = b"\x40\x05x-big" + b"\x7f" + bytes([(3000 - 127) & 0x7F | 0x80, (3000 - 127) >> 7])
    block = request_block(b"/t.T/Echo") + insert + value + b"\xbe" * 5  # ~3 KB -> 18 KB

    async def main() -> None:
        async with serving(max_header_bytes=8192) as (_, port):
            said = await exchange(port, frame(HEADERS, 0x4, 1, block))
        assert _server_settings(said)[0x6] == 8192
        assert goaway_code(said) == COMPRESSION

    run(main)


def test_an_encoded_block_over_the_limit_is_refused_before_decoding() -> None:
    big = request_block(b"/t.T/Echo") + b"\x00\x05x-big" + b"\x7f\xe1\x9c\x01" + b"v" * 20_000

    async def main() -> None:
        async with serving(max_header_bytes=8192) as (_, port):
            data = frame(HEADERS, 0, 1, big[:16_000]) + frame(CONT, 0x4, 1, big[16_000:])
            said = await exchange(port, data)
        assert goaway_code(said) == CALM

    run(main)


def test_header_lists_held_by_a_connection_have_a_budget() -> None:
    filler = literal(b"x-pad", b"p" * 1700)  # 1,971 bytes decoded a stream
    streams = b"".join(frame(HEADERS, 0x4, s, request_block(b"/t.T/Echo") + filler)
                       for s in range(1, 201, 2))  # fmt: skip

    async def main() -> None:
        async with serving(max_header_bytes=2048) as (_, port):
            said = await exchange(port, streams, wait=1.0)
        refused = [sid for kind, _, sid, p in frames_of(said) if kind == RST and p == bytes(
            [0, 0, 0, 7])]  # fmt: skip
        # 64 x 2,048 bytes: 66 streams of 1,971 bytes held, the other 34 refused
        assert len(refused) == 34, len(refused)

    run(main)


# -- time and connections -------------------------------------------------------------------


def test_an_unfinished_header_block_times_out() -> None:
    async def main() -> None:
        async with serving(header_timeout=0.3) as (_, port):
            start = time.monotonic()
            said = await exchange(port, frame(HEADERS, 0, 1, b"\x83"))
            took = time.monotonic() - start
        assert goaway_code(said) == CALM
        assert 0.3 <= took < 2.5

    run(main)


def test_a_frame_sent_a_byte_at_a_time_times_out() -> None:
    def dribble(port: int) -> bytes:
        data = frame(DATA, 0, 1, b"x" * 1000)
        out = b""
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(PREFACE + frame(SETTINGS, 0, 0, b"") + HEAD)
            with contextlib.suppress(OSError):
                for byte in data[:40]:  # one byte every 50 ms: 2 s for 40 of 1,009
                    sock.sendall(bytes([byte]))
                    time.sleep(0.05)
            with contextlib.suppress(OSError):
                while chunk := sock.recv(65536):
                    out += chunk
        return out

    async def main() -> None:
        async with serving(header_timeout=0.5, body_timeout=30) as (_, port):
            said = await asyncio.to_thread(dribble, port)
        assert goaway_code(said) == CALM

    run(main)


def test_a_connection_without_a_preface_times_out() -> None:
    def silent(port: int) -> float:
        start = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            while sock.recv(65536):
                pass
        return time.monotonic() - start

    async def main() -> None:
        async with serving(header_timeout=0.3) as (_, port):
            took = await asyncio.to_thread(silent, port)
        assert 0.3 <= took < 2.5

    run(main)


def test_a_unary_body_that_never_ends_times_out() -> None:
    async def main() -> None:
        async with serving(body_timeout=0.3) as (_, port), client(port) as c:
            sid = c.start("/t.T/Echo", message(b"hello")[:4], end=False)
            answer = await c.answer(sid)
        assert answer.status == Status.DEADLINE_EXCEEDED

    run(main)


def test_an_idle_connection_is_closed_with_goaway() -> None:
    async def main() -> None:
        async with serving(idle_timeout=0.3) as (_, port), client(port) as c:
            assert (await c.call("/t.T/Echo", message(b"hi"))).status == Status.OK
            await asyncio.wait_for(c.closed.wait(), 3)
        goaways = [e for e in c.events if type(e).__name__ == "ConnectionTerminated"]
        assert goaways
        assert goaways[0].error_code == NO_ERROR

    run(main)


def busy(port: int) -> socket.socket:
    """A connection with a request open (its body never comes)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(PREFACE + frame(SETTINGS, 0, 0, b"") + HEAD)
    return sock


def idle(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(PREFACE + frame(SETTINGS, 0, 0, b""))
    return sock


def told(sock: socket.socket, wait: float = 2.0) -> bytes:
    """What the server said on ``sock`` until it closed it (or ``wait`` passed)."""
    sock.settimeout(wait)
    out = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            out += chunk
    return out


def test_at_the_cap_the_connection_idle_longest_makes_room() -> None:
    async def main() -> None:
        async with serving(max_connections=3) as (server, port):
            first, second = idle(port), idle(port)
            await asyncio.sleep(0.1)
            third = busy(port)
            await asyncio.sleep(0.1)
            async with client(port) as c:  # a fourth: the first (idle longest) goes
                assert (await c.call("/t.T/Echo", message(b"hi"))).status == Status.OK
                said = await asyncio.to_thread(told, first)
                assert goaway_code(said) == NO_ERROR
                assert server.evicted == 1
                # the client, the second and the busy third: a fifth takes the second
                fifth = idle(port)
                assert goaway_code(await asyncio.to_thread(told, second)) == NO_ERROR
                # all busy (the client's call in flight would count too): refused
                fifth.sendall(HEAD)
                sid = c.start("/t.T/Echo", end=False)
                await asyncio.sleep(0.1)
                extra = await exchange(port, b"", wait=2.0)
                assert extra == b""  # not even SETTINGS: closed before a byte was read
                assert server.refused == 1
                await c.send(sid, message(b"done"), end=True)
                assert (await c.answer(sid)).messages == [b"done"]
            for sock in (first, second, third, fifth):
                sock.close()

    run(main)


def test_one_address_keeps_at_most_its_share() -> None:
    async def main() -> None:
        limits = ServerLimits(max_connections_per_peer=2)
        async with serving(server_limits=limits) as (server, port):
            a, b = busy(port), idle(port)
            await asyncio.sleep(0.1)
            c = idle(port)  # the address's third: its own idle one (b) goes
            assert goaway_code(await asyncio.to_thread(told, b)) == NO_ERROR
            d = busy(port)  # its fourth: c, idle, goes
            assert goaway_code(await asyncio.to_thread(told, c)) == NO_ERROR
            await asyncio.sleep(0.1)
            # a and d both busy: none of this address's may go, the new one is refused
            assert await exchange(port, b"", wait=2.0) == b""
            assert server.refused == 1
            assert server.admission.count == 2
            for sock in (a, b, c, d):
                sock.close()

    run(main)


def test_header_values_are_not_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with serving(token=b"do-not-log-me") as (_, port), client(port) as c:
            auth = ((b"authorization", b"Bearer do-not-log-me"),)
            answer = await c.call("/t.T/Echo", message(b"hi"), headers=auth)
        assert answer.status == Status.OK

    with caplog.at_level(logging.DEBUG):  # the root logger at debug, as --log-level debug
        run(main)
    assert "Bearer" in repr(caplog.records) or caplog.records  # something was logged
    assert "do-not-log-me" not in caplog.text


def test_a_full_budget_sheds_the_body_held_longest() -> None:
    async def main() -> None:
        limits = ServerLimits(max_buffered_bytes=300_000, max_stream_bytes=100_000)
        body = struct.pack(">BI", 0, 95_000) + b"u" * 80_000  # never finished

        async def unfinished(c: Any) -> int:
            sid = c.start("/t.T/Echo", end=False)
            for at in range(0, len(body), 16_000):
                await c.send(sid, body[at : at + 16_000])
            await asyncio.sleep(0.05)
            return int(sid)

        async with serving(server_limits=limits) as (server, port):
            # a connection's window is no more than the budget (300,000)
            assert server.connection_window == 300_000
            async with client(port) as a, client(port) as b:
                held = [await unfinished(a) for _ in range(3)]
                assert server.budget.used == 240_015
                # a fourth body on another connection: the first goes
                await unfinished(b)
                shed = await a.answer(held[0])
                assert shed.status == Status.RESOURCE_EXHAUSTED
                assert b"unfinished" in shed.message
                assert server.budget.used == 240_015
                assert not a.done[held[1]].is_set()
                # a check that arrives whole is answered, on either connection
                assert (await a.call("/t.T/Echo", message(b"ok"))).messages == [b"ok"]
                assert (await b.call("/t.T/Echo", message(b"ok"))).messages == [b"ok"]
            await asyncio.sleep(0.1)
            assert server.budget.used == 0  # all given back when the connections went

    run(main)
