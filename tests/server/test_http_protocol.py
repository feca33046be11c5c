"""Our HTTP/1.1 server's semantics, against a real listener on a loopback
socket spoken to in raw bytes: request smuggling shapes refused, pipelined
requests answered in order, HEAD, ``Expect: 100-continue``, HTTP/1.0,
chunked bodies both ways, the app's failures, header injection, the
disconnect event, the scope, and the drain.

The server runs on uvloop (as ``ratewarden serve`` does) in a thread of its
own, with a small ASGI app that says what it was given."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import threading
import time
import weakref
from collections.abc import Coroutine, Iterator
from typing import Any, BinaryIO, TypeVar

import pytest
import uvloop

from ratewarden.server._addresses import bind
from ratewarden.server._connection_limits import ConnectionLimits
from ratewarden.server._http_server import HttpServer

T = TypeVar("T")
GET_ECHO = b"GET /echo HTTP/1.1\r\nhost: x\r\n\r\n"
WAIT = 5.0  # seconds any one exchange may take on a loaded machine


class Echo:
    """The app: ``/echo`` answers the scope and the body it read; the other
    paths misbehave in one way each."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.disconnected = threading.Event()
        self.release: asyncio.Event | None = None  # made in the server's loop

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope["path"]
        self.paths.append(path)
        if path == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for part in (b"one,", b"", b"two,", b"three"):
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        if path == "/raise":
            raise ValueError("the app failed")
        if path == "/raise-late":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"partial", "more_body": True})
            raise ValueError("the app failed midway")
        if path == "/inject":
            headers = [(b"x-note", b"a\r\nset-cookie: stolen=1")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b"never"})
            return
        if path == "/early":  # answers before reading its body
            await reply(send, 401, b"no", [(b"content-length", b"2")])
            return
        if path == "/wait-disconnect":
            while (await receive())["type"] != "http.disconnect":
                pass
            self.disconnected.set()
            return
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message["body"]
            if not message["more_body"]:
                break
        if path == "/slow":
            if self.release is None:
                self.release = asyncio.Event()
            await self.release.wait()
        headers = [(b"content-length", b"%d" % 0)]
        said = {k: scope[k] for k in ("method", "path", "http_version", "root_path", "type")}
        said.update(raw_path=scope["raw_path"].decode(),
                    query_string=scope["query_string"].decode(),
                    client=list(scope["client"]), server=list(scope["server"]),
                    body=body.decode("latin-1"))  # fmt: skip
        if path == "/close":
            headers.append((b"connection", b"close"))
        answer = json.dumps(said).encode()
        headers[0] = (b"content-length", b"%d" % len(answer))
        await reply(send, 200, answer, headers)


async def reply(send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Running:
    """An `HttpServer` on a free loopback port, its loop in a thread."""

    def __init__(self, app: Echo, limits: ConnectionLimits) -> None:
        self.app = app
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = HttpServer(app, bind("127.0.0.1:0"), limits, 65536)
        self.port = self.server.port
        self.call(self.server.start())

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float = WAIT) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def stop(self) -> None:
        self.call(self.server.drain(0.5))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT)
        self.loop.close()

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=WAIT)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock


@pytest.fixture
def server() -> Iterator[Running]:
    # timeouts well past WAIT: a connection left open by mistake fails `closed`
    running = Running(Echo(), ConnectionLimits(idle_timeout=60, header_timeout=60, body_timeout=60))
    try:
        yield running
    finally:
        running.stop()


Answer = tuple[int, dict[bytes, bytes], bytes]


def read_answer(stream: BinaryIO, *, head: bool = False) -> Answer:
    """One answer from ``stream``, framed as its headers say (HEAD: no body)."""
    status_line = stream.readline()
    assert status_line.startswith(b"HTTP/1.1 "), status_line
    status = int(status_line.split()[1])
    headers: dict[bytes, bytes] = {}
    while (line := stream.readline()) not in (b"\r\n", b""):
        name, _, value = line.rstrip(b"\r\n").partition(b":")
        assert name.lower() not in headers, line  # no header twice in these answers
        headers[name.lower()] = value.strip()
    if head or status in (100, 204, 304):
        return status, headers, b""
    if headers.get(b"transfer-encoding") == b"chunked":
        body = b""
        while size := int(stream.readline().split(b";")[0], 16):
            body += stream.read(size)
            assert stream.read(2) == b"\r\n"
        assert stream.readline() == b"\r\n"
        return status, headers, body
    if b"content-length" in headers:
        return status, headers, stream.read(int(headers[b"content-length"]))
    return status, headers, stream.read()


def closed(sock: socket.socket) -> bool:
    """The server closed (or reset) the connection, with nothing more sent."""
    sock.settimeout(WAIT)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def said(answer: Answer) -> dict[str, Any]:
    status, _, body = answer
    assert status == 200, answer
    result: dict[str, Any] = json.loads(body)
    return result


# -- what a request must not get past -------------------------------------------------

SMUGGLING = {
    "length and chunked": b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "chunked and length": b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n",
    "length twice, equal": b"Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
    "length twice, apart": b"Content-Length: 3\r\nContent-Length: 30\r\n\r\nabc",
    "length as a list": b"Content-Length: 3, 3\r\n\r\nabc",
    "length negative": b"Content-Length: -3\r\n\r\nabc",
    "length with a sign": b"Content-Length: +3\r\n\r\nabc",
    "chunk size not hex": b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    "chunk size overflowing": b"Transfer-Encoding: chunked\r\n\r\n1" + b"0" * 20 + b"\r\na\r\n",
    "chunked not last": b"Transfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n",
    "chunk without CR": b"Transfer-Encoding: chunked\r\n\r\n3\nabc\n0\n\n",
    "space before colon": b"Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
    "folded header": b"X-A: 1\r\n Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
}
BAD_CHUNKS = {"chunk size not hex", "chunk size overflowing", "chunk without CR"}


@pytest.mark.parametrize("shape", sorted(SMUGGLING))
def test_request_smuggling_shapes_are_400_and_close(server: Running, shape: str) -> None:
    """Every shape two parsers could read as different requests is refused
    (a bad chunk perhaps once the app has the head: it is told the client
    went), and nothing after it on the connection is read."""
    with server.connect() as sock, sock.makefile("rb") as stream:
        hidden = b"GET /hidden HTTP/1.1\r\nhost: x\r\n\r\n"
        sock.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\n" + SMUGGLING[shape] + hidden)
        status, headers, body = read_answer(stream)
        assert status == 400, body
        assert headers[b"connection"] == b"close"
        assert closed(sock)
    # the head of a request with a bad chunk is good: the app may have had it
    assert server.app.paths in ([["/echo"], []] if shape in BAD_CHUNKS else [[]])


def test_a_target_that_is_not_a_path_is_400(server: Running) -> None:
    with server.connect() as sock, sock.makefile("rb") as stream:
        sock.sendall(b"GET /\xff HTTP/1.1\r\nhost: x\r\n\r\n")
        assert read_answer(stream)[0] == 400
    assert server.app.paths == []


# -- keep-alive, pipelining, HTTP/1.0 -----------------------------------------------------


def test_pipelined_requests_are_answered_in_order(server: Running) -> None:
    """The first holds its answer until the others have arrived: theirs still
    come after it, each on its own request."""
    with server.connect() as sock, sock.makefile("rb") as stream:
        sock.sendall(b"POST /slow HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\n\r\n0")
        sock.sendall(b"".join(b"POST /echo?n=%d HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\n\r\n%d"
                              % (n, n) for n in range(1, 6)))  # fmt: skip
        deadline = time.monotonic() + WAIT
        while server.app.release is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.app.paths == ["/slow"]  # the others wait for its answer
        release = server.app.release
        assert release is not None
        server.loop.call_soon_threadsafe(release.set)
        answers = [said(read_answer(stream)) for _ in range(6)]
    assert [a["body"] for a in answers] == ["0", "1", "2", "3", "4", "5"]
    assert [a["query_string"] for a in answers] == ["", "n=1", "n=2", "n=3", "n=4", "n=5"]


def test_keep_alive_and_connection_close(server: Running) -> None:
    with server.connect() as sock, sock.makefile("rb") as stream:
        for _ in range(3):
            sock.sendall(b"GET /echo HTTP/1.1\r\nhost: x\r\n\r\n")
            status, headers, _ = read_answer(stream)
            assert status == 200
            assert b"connection" not in headers
        sock.sendall(b"GET /echo HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        assert read_answer(stream)[1][b"connection"] == b"close"
        assert closed(sock)
    with server.connect() as sock, sock.makefile("rb") as stream:  # the app's own close
        sock.sendall(b"GET /close HTTP/1.1\r\nhost: x\r\n\r\n")
        assert read_answer(stream)[1][b"connection"] == b"close"
        assert closed(sock)


def test_http_1_0_closes_unless_asked_to_keep_alive(server: Running) -> None:
    with server.connect() as sock, sock.makefile("rb") as stream:
        sock.sendall(b"GET /echo HTTP/1.0\r\n\r\n")
        answer = read_answer(stream)
        assert said(answer)["http_version"] == "1.0"
        assert answer[1][b"connection"] == b"close"
        assert closed(sock)
    with server.connect() as sock, sock.makefile("rb") as stream:
        for _ in range(2):
            sock.sendall(b"GET /echo HTTP/1.0\r\nconnection: keep-alive\r\n\r\n")
            answer = read_answer(stream)
            assert said(answer)["http_version"] == "1.0"
            assert answer[1][b"connection"] == b"keep-alive"
    with server.connect() as sock, sock.makefile("rb") as stream:  # a body in two reads
        sock.sendall(b"POST /echo HTTP/1.0\r\ncontent-length: 6\r\n\r\nabc")
        time.sleep(0.05)
        sock.sendall(b"def")
        assert said(read_answer(stream))["body"] == "abcdef"
        assert closed(sock)
    with server.connect() as sock, sock.makefile("rb") as stream:  # no chunks in HTTP/1.0
        sock.sendall(b"GET /stream HTTP/1.0\r\nconnection: keep-alive\r\n\r\n")
        status, headers, body = read_answer(stream)
        assert (status, body) == (200, b"one,two,three")
        assert b"transfer-encoding" not in headers
        assert headers[b"connection"] == b"close"


def test_head_is_answered_without_a_body(server: Running) -> None:
    """The length the app gives stays; no byte of the body is sent, so the
    next answer on the connection starts where the head ends."""
    with server.connect() as sock, sock.makefile("rb") as stream:
        sock.sendall(b"HEAD /echo HTTP/1.1\r\nhost: x\r\n\r\nGET /echo HTTP/1.1\r\nhost: x\r\n\r\n")
        status, headers, _ = read_answer(stream, head=True)
        assert status == 200
        assert int(headers[b"content-length"]) > 0
        assert said(read_answer(stream))["method"] == "GET"
        sock.sendall(b"HEAD /stream HTTP/1.1\r\nhost: x\r\n\r\n" + GET_ECHO)
        status, headers, _ = read_answer(stream, head=True)
        assert b"transfer-encoding" not in headers
        assert said(read_answer(stream))["method"] == "GET"


def test_expect_100_continue(server: Running) -> None:
    """The body is asked for when the app reads it; an app that answers without
    reading it sends no 100, and the connection closes after its answer."""
    with server.connect() as sock, sock.makefile("rb") as stream:
        sock.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\n"
                     b"content-length: 5\r\n\r\n")  # fmt: skip
        assert read_answer(stream)[0] == 100
        sock.sendall(b"hello")
        assert said(read_answer(stream))["body"] == "hello"
    with server.connect() as sock, sock.makefile("rb") as stream:
        sock.sendall(b"POST /early HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\n"
                     b"content-length: 5\r\n\r\n")  # fmt: skip
        status, headers, body = read_answer(stream)
        assert (status, body, headers[b"connection"]) == (401, b"no", b"close")
        assert closed(sock)


# -- bodies -----------------------------------------------------------------------------


def test_a_chunked_request_body_reaches_the_app_whole(server: Running) -> None:
    with server.connect() as sock, sock.makefile("rb") as stream:
        sock.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
                     b"5;ext=1\r\nhello\r\n")  # fmt: skip
        time.sleep(0.05)  # the rest in another read
        sock.sendall(b"6\r\n world\r\n0\r\nx-trailer: t\r\n\r\n")
        assert said(read_answer(stream))["body"] == "hello world"
        sock.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
                     b"3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n")  # fmt: skip
        assert said(read_answer(stream))["body"] == "abcdef"  # chunks of one read
        sock.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nabc")
        assert said(read_answer(stream))["body"] == "abc"


def test_an_answer_without_a_length_is_chunked(server: Running) -> None:
    with server.connect() as sock, sock.makefile("rb") as stream:
        sock.sendall(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n" + GET_ECHO)
        _, headers, body = read_answer(stream)
        assert headers[b"transfer-encoding"] == b"chunked"
        assert body == b"one,two,three"  # an empty part is no chunk: it would end the body
        assert said(read_answer(stream))["path"] == "/echo"


# -- the app's failures ---------------------------------------------------------------------


def test_an_exception_before_the_answer_is_a_500_and_logged(
    server: Running, caplog: pytest.LogCaptureFixture
) -> None:
    with server.connect() as sock, sock.makefile("rb") as stream:
        sock.sendall(b"GET /raise HTTP/1.1\r\nhost: x\r\n\r\n")
        status, headers, body = read_answer(stream)
        assert (status, body) == (500, b"Internal Server Error")
        assert headers[b"connection"] == b"close"
        assert closed(sock)
    assert any("the app failed" in str(r.exc_info and r.exc_info[1]) for r in caplog.records)


def test_an_exception_midway_closes_the_connection(server: Running) -> None:
    """The client must see a cut answer: no last chunk, the connection closed."""
    with server.connect() as sock:
        sock.sendall(b"GET /raise-late HTTP/1.1\r\nhost: x\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert data.endswith(b"7\r\npartial\r\n")


def test_cr_lf_in_a_header_value_is_refused(server: Running) -> None:
    with server.connect() as sock, sock.makefile("rb") as stream:
        sock.sendall(b"GET /inject HTTP/1.1\r\nhost: x\r\n\r\n")
        status, headers, _ = read_answer(stream)
    assert status == 500
    assert b"set-cookie" not in headers
    assert b"x-note" not in headers


# -- the connection and the scope -------------------------------------------------------------


def test_the_app_hears_of_a_client_that_went(server: Running) -> None:
    with server.connect() as sock:
        sock.sendall(b"GET /wait-disconnect HTTP/1.1\r\nhost: x\r\n\r\n")
        deadline = time.monotonic() + WAIT
        while "/wait-disconnect" not in server.app.paths and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not server.app.disconnected.is_set()
    assert server.app.disconnected.wait(WAIT)


def test_the_scope(server: Running) -> None:
    with server.connect() as sock, sock.makefile("rb") as stream:
        sock.sendall(b"GET /a%20b/c?x=1&y=%20 HTTP/1.1\r\nhost: x\r\n\r\n")
        # an absolute target is the path of it
        sock.sendall(b"GET http://example.com/abs?q HTTP/1.1\r\nhost: x\r\n\r\n")
        first, second = said(read_answer(stream)), said(read_answer(stream))
        client = list(sock.getsockname())
    assert first["path"] == "/a b/c"
    assert first["raw_path"] == "/a%20b/c"
    assert first["query_string"] == "x=1&y=%20"
    assert first["root_path"] == ""
    assert first["client"] == client
    assert first["server"] == ["127.0.0.1", server.port]
    assert (second["path"], second["query_string"]) == ("/abs", "q")


# -- the drain ----------------------------------------------------------------------------------


def test_the_drain_closes_idle_connections_and_waits_for_answers(server: Running) -> None:
    """Idle keep-alive connections close at once, a request in flight gets its
    answer (and ``connection: close``), and no new connection is taken."""
    with server.connect() as idle, server.connect() as busy, busy.makefile("rb") as stream:
        idle.sendall(b"GET /echo HTTP/1.1\r\nhost: x\r\n\r\n")
        idle.recv(65536)
        busy.sendall(b"POST /slow HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        deadline = time.monotonic() + WAIT
        while server.app.release is None and time.monotonic() < deadline:
            time.sleep(0.01)
        draining = asyncio.run_coroutine_threadsafe(server.server.drain(60), server.loop)
        assert closed(idle)
        with pytest.raises(ConnectionRefusedError):
            server.connect().close()
        assert not draining.done()
        release = server.app.release
        assert release is not None
        server.loop.call_soon_threadsafe(release.set)
        status, headers, _ = read_answer(stream)
        assert (status, headers[b"connection"]) == (200, b"close")
        assert closed(busy)
        assert draining.result(WAIT) is None


def test_the_drain_drops_what_outlasts_it(server: Running) -> None:
    with server.connect() as busy:
        busy.sendall(b"POST /slow HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        deadline = time.monotonic() + WAIT
        while server.app.release is None and time.monotonic() < deadline:
            time.sleep(0.01)
        started = time.monotonic()
        server.call(server.server.drain(0.2))
        assert time.monotonic() - started < 0.2 + 3.0  # not until an answer that never comes
        assert closed(busy)
        assert server.server.listener.connections == set()
    address = ("127.0.0.1", server.port)
    assert repr(server.server).startswith(f"<HttpServer {address!r} <HttpListener 0 of")


def test_a_closed_connection_is_freed_without_the_collector() -> None:
    """Nothing of a connection refers back to it once it has closed (parser,
    requests): reference counting frees it, and a connection a request does
    not leave a cycle for the collector."""
    from ratewarden.server._http import HttpConnection  # noqa: PLC0415
    from ratewarden.server._http_listener import HttpListener  # noqa: PLC0415
    from tests.fuzz.test_http_split import Transport, echo  # noqa: PLC0415

    async def closed_connection() -> weakref.ref[HttpConnection]:
        connection = HttpConnection(HttpListener(ConnectionLimits(), 65536), echo)
        connection.connection_made(Transport())
        connection.data_received(b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nab")
        while connection.task is not None:
            await asyncio.sleep(0)
        connection.data_received(b"GET /y HTTP/1.1\r\nhost: x\r\n\r\n")  # lost while answered
        connection.connection_lost(None)
        await asyncio.sleep(0.01)
        return weakref.ref(connection)

    gc.disable()
    try:
        freed = asyncio.run(closed_connection())
        assert freed() is None
    finally:
        gc.enable()
