"""The HTTP API of a real ``ratewarden serve`` under random request lines and
headers, written to the socket byte by byte: what our server and httptools make of
them reaches the app too, which the in-process tests cannot show. Every answer
is below 500 (a request too broken to parse may get no answer at all), and the
server logs no error."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.fuzz import strategies as fz
from tests.fuzz.served import assert_clean_log, log_size, served_with_rules
from tests.server.process import Served

_STATUS = re.compile(rb"HTTP/1\.[01] (\d{3})")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with served_with_rules(tmp_path_factory.mktemp("fuzz-http-server")) as served:
        yield served


def exchange(served: Served, request: bytes, *, wait: float = 2.0) -> int | None:
    """Send ``request`` on a new connection; the status answered, or None if the
    server closed the connection without one. A request the server is still
    waiting on after ``wait`` seconds (a body shorter than its length, a head
    cut short) gets the end of the stream, which closes it."""
    with socket.create_connection(("127.0.0.1", served.http), timeout=10) as sock:
        sock.sendall(request)
        if wait:
            sock.settimeout(wait)
        else:
            sock.shutdown(socket.SHUT_WR)
        data = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                if sock.gettimeout() != wait:
                    raise
                sock.shutdown(socket.SHUT_WR)
                sock.settimeout(10)
                continue
            if not chunk:
                break
            data += chunk
    match = _STATUS.match(data)
    assert match or not data, data[:200]
    return int(match[1]) if match else None


# Header bytes as a client may send them, CR and LF left out so that the
# request keeps its shape (the lines themselves are fuzzed apart).
_line_bytes = st.binary(max_size=40).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
_names = st.one_of(fz.header_names, _line_bytes).map(lambda b: b.replace(b":", b"") or b"x")


@given(
    method=st.one_of(fz.methods.map(str.encode), _line_bytes),
    target=st.one_of(fz.raw_paths(), _line_bytes.map(lambda b: b"/" + b.replace(b" ", b""))),
    headers=st.lists(st.tuples(_names, st.one_of(fz.header_values, _line_bytes)), max_size=6),
    # bodies the app reads as UTF-8 (the in-process tests cover the rest)
    body=fz.bodies.map(lambda b: b.decode("utf-8", "replace").encode()),
)
@example(method=b"GET", target=b"/auth", headers=[(b"x-user", b"j\xc3\xbcrgen")], body=b"")
@example(method=b"GET", target=b"/v1/\xff\xfe", headers=[], body=b"")
@example(method=b"DELETE", target=b"/v1/keys/%ff?rule=%fe", headers=[], body=b"")
@example(method=b"POST", target=b"/v1/check", headers=[(b"content-length", b"99999999999")],
         body=b"{}")  # fmt: skip
def test_random_requests(
    served: Served, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    lines = [method + b" " + target + b" HTTP/1.1", b"host: ratewarden", b"connection: close"]
    lines += [name + b": " + value for name, value in headers]
    if not any(name.lower() == b"content-length" for name, _ in headers):
        lines.append(b"content-length: " + str(len(body)).encode())
    mark = log_size(served)
    status = exchange(served, b"\r\n".join(lines) + b"\r\n\r\n" + body)
    assert status is None or status < 500, status
    assert_clean_log(served, since=mark)


@given(raw=st.binary(max_size=300))
@example(raw=b"GET / HTTP/1.1\r\nhost: x\r\n" + b"x-a: b\r\n" * 5000 + b"\r\n")
@example(raw=b"POST /v1/check HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n")
@example(raw=b"GET /\xff HTTP/1.1\r\n\r\n")
def test_random_bytes(served: Served, raw: bytes) -> None:
    mark = log_size(served)
    status = exchange(served, raw, wait=0)
    assert status is None or status < 500, status
    assert_clean_log(served, since=mark)
