"""Our HTTP/1.1 connection under every way a client's bytes can be cut into
reads: pipelined requests (lengths and chunks, GET, POST and HEAD) fed whole
or in random pieces get the same answers, one each, in order. In process, a
transport of our own that honours the connection's pauses, as the kernel's does."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from ratewarden.server._connection_limits import ConnectionLimits
from ratewarden.server._http import HttpConnection
from ratewarden.server._http_listener import HttpListener


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.paused = False
        self.closed = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8080)}.get(name)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_write_buffer_size(self) -> int:
        return 0


async def echo(scope: Any, receive: Any, send: Any) -> None:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await asyncio.sleep(0)  # an answer that is not made at once
    answer = b"%s %s %s" % (scope["method"].encode(), scope["raw_path"], body)
    headers = [(b"content-length", b"%d" % len(answer))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


async def _answers(pieces: list[bytes]) -> bytes:
    connection = HttpConnection(HttpListener(ConnectionLimits(), 65536), echo)
    transport = Transport()
    connection.connection_made(transport)
    waiting = list(pieces)
    for _ in range(10_000):
        if waiting and not transport.paused:
            connection.data_received(waiting.pop(0))
        await asyncio.sleep(0)
        if not waiting and connection.task is None and not connection.pipeline:
            break
    connection.connection_lost(None)
    assert not transport.closed
    return bytes(transport.written)


def answers(pieces: list[bytes]) -> bytes:
    return asyncio.run(_answers(pieces))


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from([b"GET", b"POST", b"HEAD"]))
    path = b"/p%d" % draw(st.integers(0, 99))
    head = method + b" " + path + b" HTTP/1.1\r\nhost: x\r\n"
    if method != b"POST":
        return head + b"\r\n"
    body = draw(st.binary(max_size=40))
    if draw(st.booleans()):
        return head + b"content-length: %d\r\n\r\n" % len(body) + body
    sizes = draw(st.lists(st.integers(1, 16), max_size=4))
    chunks, at = [], 0
    for size in sizes:
        if at < len(body):
            chunks.append(b"%x\r\n%s\r\n" % (len(body[at : at + size]), body[at : at + size]))
            at += size
    if at < len(body):
        chunks.append(b"%x\r\n%s\r\n" % (len(body) - at, body[at:]))
    return head + b"transfer-encoding: chunked\r\n\r\n" + b"".join(chunks) + b"0\r\n\r\n"


def expected(request: bytes) -> bytes:
    """The answer `echo` gives, from the request's bytes alone."""
    line, _, rest = request.partition(b"\r\n")
    method, path, _ = line.split(b" ")
    head, _, body = rest.partition(b"\r\n\r\n")
    if b"chunked" in head:
        data = b""
        while (size := int(body[: body.index(b"\r\n")], 16)) > 0:
            start = body.index(b"\r\n") + 2
            data += body[start : start + size]
            body = body[start + size + 2 :]
        body = data
    answer = b"%s %s %s" % (method, path, body)
    length = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(answer)
    return length if method == b"HEAD" else length + answer


@given(batch=st.lists(requests(), min_size=1, max_size=5), cuts=st.lists(st.integers(0, 4096)))
def test_any_cut_of_pipelined_requests_gets_the_same_answers(
    batch: list[bytes], cuts: list[int]
) -> None:
    stream = b"".join(batch)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    pieces = [stream[a:b] for a, b in itertools.pairwise(points) if b > a]
    whole = answers([stream])
    assert whole == b"".join(expected(r) for r in batch)
    assert answers(pieces) == whole
    assert answers([bytes([b]) for b in stream]) == whole  # a byte a read
