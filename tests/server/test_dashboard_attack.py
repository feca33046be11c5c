"""The dashboard's stream attacked: by clients without the token, by text made
to break out of an event, by a wall clock stepped back, and, against a real
``ratewarden serve``, by clients that reset their connection mid-event or
crowd the streams' cap. The numbers it shows are checked against /metrics.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ratewarden.server import _dashstats, openapi
from ratewarden.server._dashboard import MAX_OVERRIDES, MAX_STREAMS
from tests.server.conftest import RULES, client_for
from tests.server.process import Served, serving_rules
from tests.server.test_dashboard import AUTH, TOKEN, fast_app, login, stream

# -- who may read it --------------------------------------------------------------------------


def test_open_checks_leave_the_stream_behind_the_token(rules_file: Path) -> None:
    """``--open-checks`` opens checks, /auth, rules and metrics to callers without
    the token. The stream carries the keys clients are limited by (addresses,
    user ids): without the token it is refused, and so cannot hold the cap."""

    async def main() -> None:
        app = fast_app(rules_file, open_checks=True)
        async with client_for(app) as client:
            assert (await client.post("/v1/check", json=login("192.0.2.9"))).status_code == 200
        async with stream(app) as anonymous:
            refused = await anonymous.start()
            assert refused["status"] == 401
            assert (b"www-authenticate", b'Bearer realm="ratewarden"') in refused["headers"]
            assert b"192.0.2.9" not in (await anonymous.sent.get())["body"]
        async with stream(app, AUTH) as events:
            assert (await events.start())["status"] == 200
            assert (await events.event())["series"] is not None
        assert app.dashboard.streams == 0

    asyncio.run(main())
    document = openapi(secured=True, open_checks=True)
    assert document["paths"]["/v1/events"]["get"].get("security") != []
    assert document["paths"]["/v1/rules"]["get"]["security"] == []


# -- what a client sends cannot break out of its place ------------------------------------------


def test_a_key_cannot_forge_events_or_lines(rules_file: Path) -> None:
    """A key holding line ends, a forged event and HTML is one JSON string in
    one data line: the stream's framing is the service's alone."""
    forged = 'x\n\nevent: snapshot\ndata: {"forged": 1}\r\n\r\n\u2028</script><b>'

    async def main() -> None:
        app = fast_app(rules_file)
        async with client_for(app) as client, stream(app, AUTH) as events:
            await events.start()
            await events.event()
            for _ in range(4):
                await client.post("/v1/check", json=login(forged), headers=AUTH)
            for _ in range(200):
                message = await asyncio.wait_for(events.sent.get(), 5)
                body: bytes = message["body"]
                assert body.count(b"\n") == 3, body[:300]  # event, data, and the blank line
                assert b"\r" not in body
                snapshot = json.loads(body.split(b"data: ", 1)[1])
                if snapshot["top"]["keys"]:
                    break
            assert snapshot["top"]["keys"][0]["key"] == forged
            assert "forged" not in snapshot

    asyncio.run(main())


def test_every_list_an_event_carries_has_a_cap(tmp_path: Path) -> None:
    """Overrides are one a rule, and a rule file may hold 10,000 rules: an event
    lists a bounded number of them, and says there are more."""
    rules = tmp_path / "many.yaml"
    many = MAX_OVERRIDES + 5
    listed = (f"  - {{name: r{n}, rate: 5/minute, match: {{paths: /r{n}}}}}\n" for n in range(many))
    rules.write_text("version: 1\nrules:\n" + "".join(listed))
    body = {"limits": ["9/minute"], "for": "10m", "reason": "x" * 200, "by": "ops"}

    async def main() -> None:
        app = fast_app(rules)
        async with client_for(app) as client:
            for n in range(many):
                put = await client.put(f"/v1/overrides/r{n}", json=body, headers=AUTH)
                assert put.status_code == 200, put.text
        async with stream(app, AUTH) as events:
            await events.start()
            overrides = (await events.event())["overrides"]
            assert len(overrides["overrides"]) == MAX_OVERRIDES
            assert overrides["more"] == 5
            assert len(overrides["audit"]) <= 20

    asyncio.run(main())


# -- the wall clock -------------------------------------------------------------------------------


def test_a_clock_stepped_back_does_not_freeze_the_streams_open(
    rules_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Samples are stamped with the wall clock, which NTP may step back: what a
    stream has sent is not told by time, or it would send nothing new until the
    clock caught up with where it was."""
    shift = [0.0]
    monkeypatch.setattr(_dashstats, "time", SimpleNamespace(time=lambda: time.time() + shift[0]))

    async def main() -> None:
        app = fast_app(rules_file)
        async with client_for(app) as client, stream(app, AUTH) as events:
            await events.start()
            while not (await events.event())["series"]:
                pass
            shift[0] = -3600.0  # an hour back
            for _ in range(5):
                await client.post("/v1/check", json=login("192.0.2.7"), headers=AUTH)
            denied = 0
            for _ in range(100):  # samples every 20 ms: a fraction of this is enough
                denied += sum(point["denied"] for point in (await events.event())["series"])
                if denied >= 2:
                    break
            assert denied == 2, "the stream sent no new sample after the clock went back"

    asyncio.run(main())


# -- the numbers agree with /metrics ---------------------------------------------------------------


def _metric(text: str, name: str, rule: str) -> int:
    match = re.search(rf'^{name}(?:_total)?{{rule="{rule}"}} ([0-9.e+]+)$', text, re.MULTILINE)
    return 0 if match is None else int(float(match.group(1)))


def test_the_rates_add_up_to_the_metrics_also_across_a_reload(rules_file: Path) -> None:
    async def main() -> None:
        app = fast_app(rules_file)
        totals: dict[str, list[int]] = {}
        requests = denied = 0

        def add(snapshot: dict[str, Any]) -> None:
            nonlocal requests, denied
            for point in snapshot["series"]:
                requests += point["requests"]
                denied += point["denied"]
                for rule, counts in point["rules"].items():
                    assert min(counts) >= 0, point
                    row = totals.setdefault(rule, [0, 0, 0])
                    for n, count in enumerate(counts):
                        row[n] += count

        async with client_for(app) as client, stream(app, AUTH) as events:
            await events.start()
            add(await events.event())  # the history: nothing counted yet
            for n in range(6):
                await client.post("/v1/check", json=login(f"192.0.2.{n % 2}"), headers=AUTH)
            assert (await app.service.reload())["reloaded"] is True
            for n in range(6):
                await client.post("/v1/check", json=login(f"192.0.2.{n % 2}"), headers=AUTH)
            text = (await client.get("/metrics", headers=AUTH)).text
            checks = _metric(text, "ratewarden_checks", "login")
            over = _metric(text, "ratewarden_over_limit", "login")
            assert (checks, over) == (12, 6)  # 3 a minute for each of two addresses
            for _ in range(200):
                if totals.get("login", [0, 0])[:2] == [checks - over, over]:
                    break
                add(await events.event())
            assert totals["login"][:2] == [checks - over, over]
            assert (requests, denied) == (12, 6)

    asyncio.run(main())


# -- a real server: clients that reset, clients that crowd -------------------------------------


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    with serving_rules(RULES, TOKEN, "--drain", "5", tmp=tmp_path) as served:
        yield served


def _open(served: Served, token: str = TOKEN) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", served.http), timeout=10)
    sock.sendall(
        b"GET /v1/events HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %s\r\n\r\n" % token.encode()
    )
    return sock


def _status(sock: socket.socket) -> bytes:
    head = b""
    while b"\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, "the server closed before answering"
        head += chunk
    return head.split(b" ", 2)[1]


def _reset(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _every_place(served: Served) -> list[socket.socket]:
    """All the streams a process allows, once the clients gone have been seen to go."""
    deadline = time.monotonic() + 10
    while True:
        streams = [_open(served) for _ in range(MAX_STREAMS)]
        statuses = [_status(s) for s in streams]
        if statuses == [b"200"] * MAX_STREAMS:
            return streams
        for sock in streams:
            sock.close()
        assert time.monotonic() < deadline, f"places stay taken: {statuses}"
        time.sleep(0.2)


def test_resets_and_refusals_leak_no_place(served: Served) -> None:
    for _ in range(3):
        streams = _every_place(served)
        anonymous = [_open(served, "wrong") for _ in range(20)]
        assert {_status(s) for s in anonymous} == {b"401"}
        crowd = [_open(served) for _ in range(20)]
        assert {_status(s) for s in crowd} == {b"503"}
        for sock in anonymous + crowd:
            sock.close()
        for sock in streams[::2]:
            _reset(sock)  # mid-stream, unread bytes and all
        for sock in streams[1::2]:
            sock.close()
    for sock in _every_place(served):
        sock.close()
    assert "Traceback" not in served.stderr.read_text()
    assert served.terminate() == 0
