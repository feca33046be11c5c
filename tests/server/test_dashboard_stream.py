"""``/v1/events`` read by a real HTTP client from ``ratewarden serve``: the
events arrive as they happen through our HTTP server, chunked, a client that
goes away frees its place, and draining ends every stream cleanly."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from ratewarden.server._dashboard import MAX_STREAMS
from tests.server.conftest import RULES
from tests.server.process import Served, serving_rules

TOKEN = "stream-token-3"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LOGIN = {"attributes": {"method": "POST", "path": "/api/login", "ip": "192.0.2.44"}}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    with serving_rules(RULES, TOKEN, "--drain", "5", tmp=tmp_path) as served:
        yield served


def events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The snapshots of an SSE answer, as they arrive."""
    buffer = ""
    for text in response.iter_text():
        buffer += text
        while "\n\n" in buffer:
            block, buffer = buffer.split("\n\n", 1)
            lines = block.split("\n")
            assert lines[0] == "event: snapshot", block[:200]
            assert lines[1].startswith("data: ")
            yield json.loads(lines[1][len("data: ") :])


def test_a_real_client_sees_denials_as_they_happen(served: Served) -> None:
    with httpx.Client(base_url=served.url, timeout=10) as client:
        assert client.get("/v1/events").status_code == 401
        with client.stream("GET", "/v1/events", headers=AUTH) as response:
            assert response.status_code == 200
            assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
            assert response.headers["cache-control"] == "no-store"
            assert response.headers["transfer-encoding"] == "chunked"
            feed = events(response)
            first = next(feed)
            assert first["rules"]["count"] == 5
            assert first["store"]["ok"] is True
            with httpx.Client(base_url=served.url, headers=AUTH, timeout=10) as checks:
                answers = [checks.post("/v1/check", json=LOGIN).json() for _ in range(5)]
            assert [a["allowed"] for a in answers] == [True, True, True, False, False]
            denied = 0
            deadline = time.monotonic() + 10
            for snapshot in feed:  # a second or two: the next sample carries them
                denied += sum(point["denied"] for point in snapshot["series"])
                if denied >= 2 or time.monotonic() > deadline:
                    break
            assert denied == 2
            assert snapshot["top"]["keys"][0]["key"] == "192.0.2.44"
            assert snapshot["pid"] == served.process.pid


def test_a_client_that_goes_frees_its_place(served: Served) -> None:
    with ExitStack() as stack:
        clients = [
            stack.enter_context(httpx.Client(base_url=served.url, headers=AUTH, timeout=10))
            for _ in range(MAX_STREAMS + 1)
        ]
        open_streams = []
        for client in clients[:MAX_STREAMS]:
            response = stack.enter_context(client.stream("GET", "/v1/events"))
            assert response.status_code == 200
            feed = events(response)  # kept: a reader that is dropped closes its connection
            next(feed)  # it is being served
            open_streams.append((client, response, feed))
        refused = clients[-1].get("/v1/events")
        assert refused.status_code == 503
        assert "dashboards are open" in refused.json()["error"]
        assert refused.headers["retry-after"] == "5"
        gone_client, gone, _ = open_streams.pop()
        gone.close()
        gone_client.close()  # its connection closes: the server sees the client go
        deadline = time.monotonic() + 10
        while True:
            with clients[-1].stream("GET", "/v1/events") as again:
                if again.status_code == 200:
                    assert next(events(again))["series"] is not None
                    break
            assert time.monotonic() < deadline, "the place of a client that went stays taken"
            time.sleep(0.1)


def test_draining_ends_the_streams_cleanly(served: Served) -> None:
    with httpx.Client(base_url=served.url, headers=AUTH, timeout=10) as client:
        with client.stream("GET", "/v1/events") as response:
            feed = events(response)
            next(feed)
            started = time.monotonic()
            served.process.send_signal(15)
            rest = list(feed)  # ends when the server ends the answer, without an error
            ended = time.monotonic() - started
        assert all(not snapshot.get("draining") for snapshot in rest[:-1])
    assert served.process.wait(10) == 0
    assert ended < 3, f"the stream held the drain for {ended:.1f} s"
