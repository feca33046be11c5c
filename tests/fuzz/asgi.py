"""One request through the ASGI app in this process, built as our server builds its
scope, so that a test controls every byte (httpx would refuse or fix some)."""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from ratewarden.server import App


@dataclass
class Answer:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)

    def problem(self) -> str:
        """The ``error`` of a 4xx answer; fails if it has none."""
        try:
            error = json.loads(self.body)["error"]
        except (ValueError, KeyError, TypeError):
            raise AssertionError(f"{self.status} without an error message: {self.body!r}") from None
        assert isinstance(error, str), self.body
        assert error.strip(), self.body
        return error


def scope_of(method: str, raw_path: bytes, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    target, _, query = raw_path.partition(b"?")
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        # what our server (server/_http.py) makes of the target
        "path": unquote(target.decode("ascii")),
        "raw_path": target,
        "query_string": query,
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8080),
    }


async def call(
    app: App,
    method: str,
    raw_path: bytes,
    *,
    body: bytes = b"",
    headers: list[tuple[bytes, bytes]] | None = None,
    chunks: int = 1,
) -> Answer:
    """Send the request (its body in ``chunks`` pieces); the app must answer
    once: a start and a body. An exception from the app propagates, since a
    server would turn it into a 500."""
    headers = list(headers or [])
    if not any(name == b"host" for name, _ in headers):  # as a client sends it (HTTP/1.1)
        headers.insert(0, (b"host", b"127.0.0.1:8080"))
    if body and not any(name == b"content-length" for name, _ in headers):
        headers.append((b"content-length", str(len(body)).encode()))
    size = max(1, -(-len(body) // chunks))
    pieces = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    messages = [{"type": "http.request", "body": p, "more_body": n < len(pieces) - 1}
                for n, p in enumerate(pieces)]  # fmt: skip
    sent: list[dict[str, Any]] = []

    async def receive() -> MutableMapping[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    await app(scope_of(method, raw_path, headers), receive, send)
    kinds = [m["type"] for m in sent]
    assert kinds == ["http.response.start", "http.response.body"], kinds
    start, end = sent
    assert not end.get("more_body", False)
    return Answer(start["status"], list(start.get("headers", [])), end.get("body", b""))
