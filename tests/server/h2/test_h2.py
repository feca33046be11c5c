"""The HTTP/2 server under gRPC (`ratewarden.server.h2._connection`), spoken to by h2's
client state machine (an independent implementation) and by raw frames for
what a well-behaved client never sends."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
import struct
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
import pytest

from ratewarden.server._connection_limits import BodyBudget, ConnectionLimits, ServerLimits
from ratewarden.server.h2._frames import PREFACE, frame
from ratewarden.server.h2._grpc import (
    MAX_MESSAGE,
    Call,
    GrpcError,
    H2Server,
    Metadata,
    Method,
    Status,
)


def message(payload: bytes, compressed: bool = False) -> bytes:
    return struct.pack(">BI", int(compressed), len(payload)) + payload


def messages_of(data: bytes) -> list[bytes]:
    out, at = [], 0
    while at < len(data):
        _, length = struct.unpack_from(">BI", data, at)
        out.append(data[at + 5 : at + 5 + length])
        at += 5 + length
    return out


class Answer:
    def __init__(self) -> None:
        self.headers: dict[bytes, bytes] = {}
        self.data = b""
        self.trailers: dict[bytes, bytes] = {}
        self.reset: int | None = None

    @property
    def status(self) -> int:
        where = self.trailers or self.headers
        return int(where.get(b"grpc-status", b"-1"))

    @property
    def message(self) -> bytes:
        return (self.trailers or self.headers).get(b"grpc-message", b"")

    @property
    def messages(self) -> list[bytes]:
        return messages_of(self.data)


class Client:
    """h2's client over an asyncio connection: one call at a time, or several
    started before their answers are read. ``reads=False``: a client that never
    takes in the data it receives, so it never opens the server's window again
    (h2 sends a WINDOW_UPDATE for every acknowledgement, even of 10 bytes)."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        settings: dict[Any, int] | None = None,
        *,
        reads: bool = True,
    ) -> None:
        self.reader, self.writer = reader, writer
        self.reads = reads
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.conn = h2.connection.H2Connection(config)
        self.conn.initiate_connection()
        if settings:
            self.conn.update_settings(settings)
        self.answers: dict[int, Answer] = {}
        self.done: dict[int, asyncio.Event] = {}
        self.events: list[Any] = []
        self.closed = asyncio.Event()
        self.flush()
        self.pump = asyncio.ensure_future(self._pump())

    def flush(self) -> None:
        self.writer.write(self.conn.data_to_send())

    async def _pump(self) -> None:
        while True:
            data = await self.reader.read(65536)
            if not data:
                self.closed.set()
                return
            for event in self.conn.receive_data(data):
                self.events.append(event)
                sid: int = getattr(event, "stream_id", 0) or 0
                answer = self.answers.get(sid)
                if isinstance(event, h2.events.ResponseReceived) and answer is not None:
                    answer.headers = dict(event.headers)
                elif isinstance(event, h2.events.TrailersReceived) and answer is not None:
                    answer.trailers = dict(event.headers)
                elif isinstance(event, h2.events.DataReceived) and answer is not None:
                    answer.data += event.data
                    if self.reads:
                        self.conn.acknowledge_received_data(event.flow_controlled_length, sid)
                elif isinstance(event, h2.events.StreamEnded) and sid in self.done:
                    self.done[sid].set()
                elif isinstance(event, h2.events.StreamReset) and answer is not None:
                    answer.reset = event.error_code
                    self.done[sid].set()
                elif isinstance(event, h2.events.ConnectionTerminated):
                    self.closed.set()
            self.flush()

    def start(
        self,
        path: str,
        body: bytes = b"",
        *,
        method: bytes = b"POST",
        headers: tuple[tuple[bytes, bytes], ...] = (),
        end: bool = True,
        content_type: bytes = b"application/grpc",
        pad: int | None = None,
    ) -> int:
        sid = self.conn.get_next_available_stream_id()
        self.answers[sid] = Answer()
        self.done[sid] = asyncio.Event()
        request = [(b":method", method), (b":scheme", b"http"), (b":path", path.encode()),
                   (b":authority", b"test"), (b"content-type", content_type),
                   (b"te", b"trailers"), *headers]  # fmt: skip
        self.conn.send_headers(sid, request, end_stream=not body and end)
        if body:
            self.conn.send_data(sid, body, end_stream=end, pad_length=pad)
        self.flush()
        return sid

    async def send(self, sid: int, body: bytes, end: bool = False) -> None:
        while self.conn.local_flow_control_window(sid) < len(body):
            await asyncio.sleep(0.01)  # the pump applies the server's WINDOW_UPDATEs
        self.conn.send_data(sid, body, end_stream=end)
        self.flush()

    async def answer(self, sid: int) -> Answer:
        await asyncio.wait_for(self.done[sid].wait(), 10)
        return self.answers[sid]

    async def call(self, path: str, body: bytes = b"", **kw: Any) -> Answer:
        return await self.answer(self.start(path, body, **kw))

    async def close(self) -> None:
        self.pump.cancel()
        self.writer.close()
        await self.writer.wait_closed()


async def echo(request: bytes, metadata: Metadata) -> bytes:
    return request


async def big(request: bytes, metadata: Metadata) -> bytes:
    return b"x" * int(request)


async def fail(request: bytes, metadata: Metadata) -> bytes:
    raise GrpcError(Status.INVALID_ARGUMENT, request.decode())


async def crash(request: bytes, metadata: Metadata) -> bytes:
    raise RuntimeError("a bug")


async def header(request: bytes, metadata: Metadata) -> bytes:
    return metadata.get(request, b"<none>")


async def chat(call: Call) -> None:
    while (got := await call.recv()) is not None:
        await call.send(got.upper())


SLOW: dict[str, Any] = {}


async def slow(request: bytes, metadata: Metadata) -> bytes:
    SLOW["started"].set()
    try:
        await SLOW["release"].wait()
    except asyncio.CancelledError:
        SLOW["cancelled"] = True
        raise
    return b"finally"


METHODS = {
    "/t.T/Echo": Method("unary", echo),
    "/t.T/Big": Method("unary", big),
    "/t.T/Fail": Method("unary", fail),
    "/t.T/Crash": Method("unary", crash),
    "/t.T/Header": Method("unary", header),
    "/t.T/Chat": Method("streaming", chat),
    "/t.T/Slow": Method("unary", slow),
    "/t.T/Open": Method("unary", echo, public=True),
}


@asynccontextmanager
async def serving(
    token: bytes | None = None,
    limits: ConnectionLimits | None = None,
    server_limits: ServerLimits | None = None,
    budget: BodyBudget | None = None,
) -> AsyncIterator[tuple[H2Server, int]]:
    server = H2Server(METHODS, token=token, limits=limits, server_limits=server_limits,
                      budget=budget)  # fmt: skip
    port = await server.listen("127.0.0.1", 0)
    try:
        yield server, port
    finally:
        await server.stop(0)


@asynccontextmanager
async def client(
    port: int, settings: dict[Any, int] | None = None, *, reads: bool = True
) -> AsyncIterator[Client]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    c = Client(reader, writer, settings, reads=reads)
    try:
        yield c
    finally:
        await c.close()


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def test_unary_calls_many_at_once() -> None:
    async def main() -> None:
        async with serving() as (_, port), client(port) as c:
            sids = [c.start("/t.T/Echo", message(b"hello %d" % i)) for i in range(50)]
            answers = [await c.answer(sid) for sid in sids]
        for i, answer in enumerate(answers):
            assert answer.headers[b":status"] == b"200"
            assert answer.headers[b"content-type"] == b"application/grpc"
            assert answer.status == Status.OK
            assert answer.messages == [b"hello %d" % i]

    run(main)


def test_errors_are_grpc_statuses() -> None:
    async def main() -> None:
        async with serving() as (_, port), client(port) as c:
            failed = await c.call("/t.T/Fail", message("bad ünicode 100%".encode()))
            crashed = await c.call("/t.T/Crash", message(b""))
            unknown = await c.call("/t.T/Nope", message(b""))
            empty = await c.call("/t.T/Echo")
            two = await c.call("/t.T/Echo", message(b"a") + message(b"b"))
            torn = await c.call("/t.T/Echo", message(b"abc")[:-1])
        assert failed.status == Status.INVALID_ARGUMENT
        # grpc-message is percent-encoded UTF-8
        assert failed.message == b"bad %C3%BCnicode 100%25"
        assert (crashed.status, crashed.message) == (Status.INTERNAL, b"internal error")
        # trailers-only: one HEADERS frame with the status in it
        assert unknown.status == Status.UNIMPLEMENTED
        assert not unknown.trailers
        assert b"/t.T/Nope" in unknown.message
        assert empty.status == two.status == torn.status == Status.INVALID_ARGUMENT

    run(main)


def test_not_grpc_gets_http_statuses() -> None:
    async def main() -> None:
        async with serving() as (_, port), client(port) as c:
            get = await c.call("/t.T/Echo", method=b"GET")
            json = await c.call("/t.T/Echo", message(b"{}"), content_type=b"application/json")
        assert get.headers[b":status"] == b"405"
        assert json.headers[b":status"] == b"415"

    run(main)


def test_padding_priority_and_continuation() -> None:
    async def main() -> None:
        limits = ConnectionLimits(max_header_bytes=64 * 1024)
        async with serving(limits=limits) as (_, port), client(port) as c:
            padded = await c.call("/t.T/Echo", message(b"padded"), pad=200)
            # a 40 KB header value: h2 splits the block into HEADERS + CONTINUATIONs
            value = b"v" * 40_000
            sid = c.start("/t.T/Header", message(b"x-big"), headers=((b"x-big", value),))
            long = await c.answer(sid)
            sid = c.conn.get_next_available_stream_id()
            c.answers[sid], c.done[sid] = Answer(), asyncio.Event()
            c.conn.send_headers(sid, [(b":method", b"POST"), (b":scheme", b"http"),
                                      (b":path", b"/t.T/Echo"), (b":authority", b"t"),
                                      (b"content-type", b"application/grpc")],
                                priority_weight=200, priority_depends_on=0)  # fmt: skip
            c.conn.send_data(sid, message(b"prio"), end_stream=True)
            c.flush()
            prio = await c.answer(sid)
        assert padded.messages == [b"padded"]
        assert long.messages == [value]
        assert prio.messages == [b"prio"]

    run(main)


def test_flow_control_both_ways() -> None:
    async def main() -> None:
        # the client lets the server send 1,000 bytes a stream at first
        settings = {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1000}
        async with serving() as (_, port), client(port, settings) as c:
            answer = await c.call("/t.T/Big", message(b"300000"))
            assert answer.messages == [b"x" * 300_000]
            # 200 KB: more than the protocol's default window (64 KiB), within
            # the window the server gives a stream
            sid = c.start("/t.T/Echo", end=False)
            body = message(b"y" * 200_000)
            for at in range(0, len(body), 16_384):
                await c.send(sid, body[at : at + 16_384])
            await c.send(sid, b"", end=True)
            echoed = await c.answer(sid)
        assert echoed.messages == [b"y" * 200_000]

    run(main)


def test_a_message_larger_than_a_stream_may_hold_is_refused_at_once() -> None:
    async def main() -> None:
        limits = ServerLimits(max_stream_bytes=100_000)
        async with serving(server_limits=limits) as (_, port), client(port) as c:
            # its length prefix says 3 MB: answered before the body is sent
            sid = c.start("/t.T/Echo", struct.pack(">BI", 0, 3_000_000) + b"y" * 1000, end=False)
            refused = await asyncio.wait_for(c.answer(sid), 5)
            after = await c.call("/t.T/Echo", message(b"z" * 16_000))
        assert refused.status == Status.RESOURCE_EXHAUSTED
        assert b"99995 bytes" in refused.message
        assert after.messages == [b"z" * 16_000]

    run(main)


def test_too_large_and_compressed_messages() -> None:
    async def main() -> None:
        async with serving() as (_, port), client(port) as c:
            packed = gzip.compress(b"z" * 10_000)
            zipped = await c.call("/t.T/Echo", message(packed, compressed=True),
                                  headers=((b"grpc-encoding", b"gzip"),))  # fmt: skip
            unsaid = await c.call("/t.T/Echo", message(packed, compressed=True))
            brotli = await c.call("/t.T/Echo", message(b"x"), headers=((b"grpc-encoding", b"br"),))
            bomb = gzip.compress(b"\0" * (MAX_MESSAGE + 10))
            exploded = await c.call("/t.T/Echo", message(bomb, compressed=True),
                                    headers=((b"grpc-encoding", b"gzip"),))  # fmt: skip
            sid = c.start("/t.T/Echo", end=False)
            huge = message(b"h" * (MAX_MESSAGE + 1))
            for at in range(0, 200_000, 16_384):  # within the stream's window
                if c.done[sid].is_set():
                    break
                await c.send(sid, huge[at : at + 16_384])
            too_big = await c.answer(sid)
            after = await c.call("/t.T/Echo", message(b"still here"))
        assert zipped.messages == [b"z" * 10_000]
        assert unsaid.status == Status.INTERNAL
        assert brotli.status == Status.UNIMPLEMENTED
        assert exploded.status == Status.RESOURCE_EXHAUSTED
        assert too_big.status == Status.RESOURCE_EXHAUSTED
        assert after.messages == [b"still here"]  # only that call failed

    run(main)


def test_bearer_token_and_public_methods() -> None:
    async def main() -> None:
        async with serving(token=b"s3cret") as (_, port), client(port) as c:
            anonymous = await c.call("/t.T/Echo", message(b"a"))
            wrong = await c.call("/t.T/Echo", message(b"a"),
                                 headers=((b"authorization", b"Bearer nope"),))  # fmt: skip
            right = await c.call("/t.T/Echo", message(b"a"),
                                 headers=((b"authorization", b"bearer s3cret"),))  # fmt: skip
            # the same header block again: the server's decoded-block cache must
            # not hand one request's headers to another
            again_wrong = await c.call("/t.T/Echo", message(b"a"),
                                       headers=((b"authorization", b"Bearer nope"),))  # fmt: skip
            public = await c.call("/t.T/Open", message(b"a"))
        assert anonymous.status == wrong.status == again_wrong.status == Status.UNAUTHENTICATED
        assert right.status == public.status == Status.OK

    run(main)


def test_changing_headers_are_decoded_afresh() -> None:
    async def main() -> None:
        async with serving() as (_, port), client(port) as c:
            seen = []
            for value in [b"one", b"two", b"one", b"one", b"three", b"two"]:
                answer = await c.call("/t.T/Header", message(b"x-value"),
                                      headers=((b"x-value", value),))  # fmt: skip
                seen.append(answer.messages[0])
        assert seen == [b"one", b"two", b"one", b"one", b"three", b"two"]

    run(main)


def test_streaming_call() -> None:
    async def main() -> None:
        async with serving() as (_, port), client(port) as c:
            sid = c.start("/t.T/Chat", end=False)
            for word in (b"a", b"bb", b"ccc"):
                await c.send(sid, message(word))
            await c.send(sid, b"", end=True)
            answer = await c.answer(sid)
        assert answer.messages == [b"A", b"BB", b"CCC"]
        assert answer.status == Status.OK

    run(main)


def test_a_reset_call_is_cancelled() -> None:
    async def main() -> None:
        SLOW.update(started=asyncio.Event(), release=asyncio.Event(), cancelled=False)
        async with serving() as (_, port), client(port) as c:
            sid = c.start("/t.T/Slow", message(b""))
            await asyncio.wait_for(SLOW["started"].wait(), 5)
            c.conn.reset_stream(sid)
            c.flush()
            for _ in range(100):
                if SLOW["cancelled"]:
                    break
                await asyncio.sleep(0.01)
            after = await c.call("/t.T/Echo", message(b"next"))
        assert SLOW["cancelled"]
        assert after.messages == [b"next"]

    run(main)


def test_stop_drains_calls_in_flight() -> None:
    # grpcio's client here: h2's takes a GOAWAY for the end of everything
    import grpc  # noqa: PLC0415

    async def main() -> None:
        SLOW.update(started=asyncio.Event(), release=asyncio.Event(), cancelled=False)
        server = H2Server(METHODS)
        port = await server.listen("127.0.0.1", 0)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/t.T/Slow")
            slow_call = asyncio.ensure_future(call(b"", timeout=10))
            await asyncio.wait_for(SLOW["started"].wait(), 5)
            stopping = asyncio.ensure_future(server.stop(5))
            await asyncio.sleep(0.1)
            assert not stopping.done()  # a call is in flight
            SLOW["release"].set()
            assert await slow_call == b"finally"
            await asyncio.wait_for(stopping, 5)  # well before the grace: the call is done
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await channel.unary_unary("/t.T/Echo")(b"", timeout=2)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert not SLOW["cancelled"]

    run(main)


def test_stop_ends_calls_after_the_grace() -> None:
    async def main() -> None:
        SLOW.update(started=asyncio.Event(), release=asyncio.Event(), cancelled=False)
        server = H2Server(METHODS)
        port = await server.listen("127.0.0.1", 0)
        async with client(port) as c:
            c.start("/t.T/Slow", message(b""))
            await asyncio.wait_for(SLOW["started"].wait(), 5)
            await asyncio.wait_for(server.stop(0.1), 5)
            await asyncio.wait_for(c.closed.wait(), 5)
        assert SLOW["cancelled"]

    run(main)


def raw_exchange(port: int, data: bytes) -> bytes:
    """Sends raw bytes after the preface; what the server said until it closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(PREFACE + frame(4, 0, 0, b"") + data)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out


def goaway_code(data: bytes) -> int:
    at = 0
    while at + 9 <= len(data):
        length = int.from_bytes(data[at : at + 3], "big")
        if data[at + 3] == 7:  # GOAWAY
            return int.from_bytes(data[at + 13 : at + 17], "big")
        at += 9 + length
    raise AssertionError(f"no GOAWAY in {data!r}")


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (frame(0, 0, 0, b"x"), 0x1),  # DATA on stream 0
        (frame(0, 0, 0, b"x" * 20_000), 0x6),  # a frame over 16 KB
        (frame(1, 0x4, 1, b"\xff\xff\xff\xff\xff"), 0x9),  # a header block HPACK refuses
        (frame(1, 0x0, 1, b"\x82") + frame(0, 0, 1, b"x"), 0x1),  # HEADERS cut off
        (frame(6, 0, 0, b"1234567"), 0x6),  # a PING of 7 bytes
        (frame(4, 0, 0, b"\x00\x04\xff\xff\xff\xff"), 0x3),  # INITIAL_WINDOW_SIZE too big
        (frame(8, 0, 0, b"\x00\x00\x00\x00"), 0x1),  # WINDOW_UPDATE of 0
        (frame(1, 0x4, 2, b"\x83"), 0x1),  # a client stream with an even number
        (frame(5, 0x4, 1, b"\x00\x00\x00\x02"), 0x1),  # PUSH_PROMISE from a client
    ],
)
def test_protocol_errors_close_with_goaway(data: bytes, code: int) -> None:
    async def main() -> None:
        async with serving() as (_, port):
            said = await asyncio.to_thread(raw_exchange, port, data)
        assert goaway_code(said) == code

    run(main)


def test_ping_and_unknown_frames() -> None:
    def exchange(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(PREFACE + frame(4, 0, 0, b"") + frame(0xEE, 0, 0, b"?") +
                         frame(6, 0, 0, b"pingpong"))  # fmt: skip
            out = b""
            while b"pingpong" not in out:
                out += sock.recv(65536)
            return out

    async def main() -> None:
        async with serving() as (_, port):
            said = await asyncio.to_thread(exchange, port)
        assert frame(6, 0x1, 0, b"pingpong") in said

    run(main)


def test_not_http2_is_dropped() -> None:
    def exchange(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            out = b""
            while chunk := sock.recv(65536):  # until the server closes
                out += chunk
            return out

    async def main() -> None:
        async with serving() as (_, port):
            said = await asyncio.to_thread(exchange, port)
            async with client(port) as c:  # the server is still fine
                answer = await c.call("/t.T/Echo", message(b"ok"))
        assert said[3] == 4  # our SETTINGS, sent on connecting, and then the server closed
        assert b"HTTP/1.1" not in said
        assert answer.messages == [b"ok"]

    run(main)


def test_a_second_end_of_a_unary_request_resets_it() -> None:
    def exchange(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            block = b"\x83\x86" + b"\x04\x09/t.T/Echo" + b"\x0f\x10\x10application/grpc"
            sock.sendall(PREFACE + frame(4, 0, 0, b"")
                         + frame(1, 0x4, 1, block) + frame(0, 0x1, 1, message(b"once"))
                         + frame(1, 0x5, 1, b"")  # "trailers" ending it again
                         + frame(6, 0, 0, b"pingpong"))  # fmt: skip
            out = b""
            while b"pingpong" not in out:
                out += sock.recv(65536)
            return out

    async def main() -> None:
        async with serving() as (_, port):
            said = await asyncio.to_thread(exchange, port)
        # RST_STREAM STREAM_CLOSED, and the call that was about to run did not
        assert frame(3, 0, 1, (5).to_bytes(4, "big")) in said
        assert b"once" not in said

    run(main)


def test_a_streaming_client_that_does_not_read_is_cut_off() -> None:
    async def flood(call: Call) -> None:
        while True:
            await call.send(b"x" * 1000)

    async def main() -> None:
        limits = ConnectionLimits(idle_timeout=0.5)
        server = H2Server({"/t.T/Flood": Method("streaming", flood)}, limits=limits)
        port = await server.listen("127.0.0.1", 0)
        try:
            # a window of 10 bytes a stream: the answers pile up on the server
            settings = {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 10}
            async with client(port, settings, reads=False) as c:
                answer = await c.call("/t.T/Flood", message(b""), end=False)
        finally:
            await server.stop(0)
        assert answer.status == Status.RESOURCE_EXHAUSTED

    run(main)


def frames_of(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out, at = [], 0
    while at + 9 <= len(data):
        length = int.from_bytes(data[at : at + 3], "big")
        kind, flags = data[at + 3], data[at + 4]
        sid = int.from_bytes(data[at + 5 : at + 9], "big") & 0x7FFFFFFF
        out.append((kind, flags, sid, data[at + 9 : at + 9 + length]))
        at += 9 + length
    return out


def request_block(path: bytes) -> bytes:
    """:method POST, :scheme http, :path, content-type: literals, no table."""
    return (b"\x83\x86" + bytes((0x04, len(path))) + path
            + b"\x0f\x10\x10application/grpc")  # fmt: skip


def answered(data: bytes) -> bool:
    """Stream 1 has its last HEADERS (END_STREAM) in ``data``."""
    return any(kind == 1 and flags & 1 and sid == 1 for kind, flags, sid, _ in frames_of(data))


def exchange_until_answered(port: int, data: bytes, settings: bytes = b"") -> bytes:
    """Sends the preface, ``settings`` and ``data``; what the server said until
    stream 1 was answered (or the server closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(PREFACE + frame(4, 0, 0, settings) + data)
        out = b""
        while not answered(out):
            chunk = sock.recv(65536)
            if not chunk:
                break
            out += chunk
        return out


def test_a_streaming_call_refused_at_once_still_says_status() -> None:
    # HEADERS and a cut-off message in one read: the call fails before its handler
    # ran, and the answer must still be a whole response (:status first)
    data = (frame(1, 0x4, 1, request_block(b"/t.T/Chat"))
            + frame(0, 0x1, 1, message(b"abc")[:-1]))  # fmt: skip

    async def main() -> None:
        async with serving() as (_, port):
            said = await asyncio.to_thread(exchange_until_answered, port, data)
        (block,) = [p for kind, _, sid, p in frames_of(said) if kind == 1 and sid == 1]
        headers = dict(hpack.Decoder().decode(block, raw=True))
        assert headers[b":status"] == b"200"
        assert headers[b"grpc-status"] == b"3"

    run(main)


def test_a_smaller_header_table_is_acknowledged_in_the_next_block() -> None:
    data = frame(1, 0x4, 1, request_block(b"/t.T/Echo")) + frame(0, 0x1, 1, message(b"hi"))
    table_size_0 = struct.pack(">HI", 1, 0)

    async def main() -> None:
        async with serving() as (_, port):
            said = await asyncio.to_thread(exchange_until_answered, port, data, table_size_0)
        blocks = [p for kind, _, sid, p in frames_of(said) if kind == 1 and sid == 1]
        assert blocks[0][0] == 0x20  # RFC 7541 4.2: a dynamic table size update to 0
        assert blocks[1][0] != 0x20  # once

    run(main)


def test_cut_short_gzip_is_refused() -> None:
    async def main() -> None:
        packed = gzip.compress(b"z" * 1000)
        async with serving() as (_, port), client(port) as c:
            for broken in (packed[:-4], packed[: len(packed) // 2], packed + b"junk"):
                answer = await c.call("/t.T/Echo", message(broken, compressed=True),
                                      headers=((b"grpc-encoding", b"gzip"),))  # fmt: skip
                assert answer.status == Status.INTERNAL

    run(main)


def test_rapid_reset_is_told_to_calm_down() -> None:
    block = request_block(b"/t.T/Echo")
    data = b"".join(
        frame(1, 0x4, sid, block) + frame(3, 0, sid, b"\0\0\0\x08") for sid in range(1, 6001, 2)
    )

    async def main() -> None:
        async with serving() as (_, port):
            said = await asyncio.to_thread(raw_exchange, port, data)
        assert goaway_code(said) == 0xB  # ENHANCE_YOUR_CALM

    run(main)


def ignoring_windows(port: int, streams: int, per_stream: int) -> bytes:
    """A client that ignores flow control: ``streams`` streams, ``per_stream``
    bytes of DATA each (in frames of 16,000), none ended; what the server said."""
    out = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(PREFACE + frame(4, 0, 0, struct.pack(">HI", 4, 2**31 - 1)))
        try:
            for sid in range(1, 2 * streams, 2):
                sock.sendall(frame(1, 0x4, sid, request_block(b"/t.T/Echo")))
                chunk = frame(0, 0, sid, b"\0" * 16_000)
                for _ in range(per_stream // 16_000):
                    sock.sendall(chunk)
        except OSError:
            pass  # the server closed on us
        sock.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            while data := sock.recv(65536):
                out += data
    return out


def test_unfinished_requests_are_bounded_by_the_windows() -> None:
    async def main() -> None:
        limits = ServerLimits(max_stream_bytes=100_000)
        async with serving(server_limits=limits) as (server, port):
            # 20 streams within their windows, past the connection's (1 MiB)
            said = await asyncio.to_thread(ignoring_windows, port, 20, 96_000)
            # one stream past its window: that stream alone is reset
            one = await asyncio.to_thread(ignoring_windows, port, 1, 112_000)
            assert server.budget.used == 0
        assert goaway_code(said) == 0x3  # FLOW_CONTROL_ERROR
        resets = [(sid, p) for kind, _, sid, p in frames_of(one) if kind == 3]
        assert resets == [(1, struct.pack(">I", 0x3))]
        assert all(kind != 7 for kind, *_ in frames_of(one))  # no GOAWAY

    run(main)


def test_a_streaming_message_limit_is_per_message(monkeypatch: pytest.MonkeyPatch) -> None:
    from ratewarden.server.h2 import _grpc  # noqa: PLC0415

    monkeypatch.setattr(_grpc, "MAX_MESSAGE", 1000)

    async def main() -> None:
        async with serving() as (_, port), client(port) as c:
            # two messages of 900 bytes in one frame: 1,810 bytes buffered, each fine
            sid = c.start("/t.T/Chat", message(b"a" * 900) + message(b"b" * 900))
            ok = await c.answer(sid)
            big = await c.call("/t.T/Chat", message(b"c" * 1001))
        assert ok.messages == [b"A" * 900, b"B" * 900]
        assert big.status == Status.RESOURCE_EXHAUSTED

    run(main)
