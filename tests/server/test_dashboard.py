"""The dashboard's parts without a browser: the top-keys sketch, the per-second
rates, the service's hook, the page and its headers, and the event stream
driven through the ASGI app (a real HTTP client reads it in
test_dashboard_stream.py)."""

from __future__ import annotations

import asyncio
import collections
import json
import re
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratewarden.server import App
from ratewarden.server._dashboard import CSP, Dashboard
from ratewarden.server._dashstats import MAX_KEY, DashboardStats, SpaceSaving, TopKeys
from tests.server.conftest import client_for, make_app

TOKEN = "dash-token-7"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def login(ip: str) -> dict[str, Any]:
    return {"attributes": {"method": "POST", "path": "/api/login", "ip": ip}}


# -- the sketch --------------------------------------------------------------------------


def test_space_saving_is_exact_while_the_keys_fit() -> None:
    sketch: SpaceSaving[str] = SpaceSaving(4)
    for item in "abacabad":
        sketch.add(item)
    assert sketch.counts == {"a": 4, "b": 2, "c": 1, "d": 1}
    assert set(sketch.errors.values()) == {0}
    assert sketch.total == 8


def test_a_new_key_takes_the_oldest_lowest_counter_and_inherits_its_count() -> None:
    sketch: SpaceSaving[str] = SpaceSaving(3)
    for item in "aabcd":  # a=2, b=1, c=1; d replaces b (the older of the ones)
        sketch.add(item)
    assert sketch.counts == {"a": 2, "c": 1, "d": 2}
    assert sketch.errors["d"] == 1
    sketch.add("e")  # c is now the only one at the lowest count
    assert sketch.counts == {"a": 2, "d": 2, "e": 2}
    assert sketch.errors["e"] == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=400), st.integers(1, 8))
def test_space_saving_bounds_every_count_and_keeps_the_heavy_hitters(
    stream: list[int], capacity: int
) -> None:
    sketch: SpaceSaving[int] = SpaceSaving(capacity)
    for item in stream:
        sketch.add(item)
    true = collections.Counter(stream)
    assert len(sketch) <= capacity
    assert sum(sketch.counts.values()) == len(stream)  # space-saving's own invariant
    for item, count in sketch.counts.items():
        assert count - sketch.errors[item] <= true[item] <= count
    for item, count in true.items():  # more than n / capacity: always held
        if count > len(stream) / capacity:
            assert item in sketch.counts


def test_top_keys_rotate_per_window_and_cut_long_keys() -> None:
    top = TopKeys(capacity=8, window=60)
    top.rotate_if_due(1000.0)
    for _ in range(3):
        top.add("login", "ip:1")
    top.add("login", "x" * 5000)
    top.rotate_if_due(1059.0)  # not yet
    top.add("login", "ip:1")
    assert top.top(10)[0] == {"rule": "login", "key": "ip:1", "denied": 4, "error": 0}
    assert len(top.top(10)[1]["key"]) == MAX_KEY + 1  # cut, with an ellipsis
    top.rotate_if_due(1060.0)  # the last window is still shown
    top.add("search", "u")
    shown = [(e["key"][:2], e["denied"]) for e in top.top(10)]
    assert shown == [("ip", 4), ("xx", 1), ("u", 1)]  # ties by rule, then key
    top.rotate_if_due(1120.0)  # two windows on: only the newest generation's
    assert [e["key"] for e in top.top(10)] == ["u"]
    assert top.counted == 1


def test_memory_stays_bounded_under_a_flood_of_distinct_denied_keys(rules_file: Path) -> None:
    """A client denied under a million keys makes the service hold no more
    counters than the sketch has: measured with tracemalloc across the flood."""

    async def main() -> None:
        app = make_app(rules_file)
        service = app.service
        stats = service.dashboard

        async def flood(first: int, count: int) -> None:
            for n in range(first, first + count):
                key = f"203.0.113.{n % 250}:{n}:" + "k" * 100
                # a cost over the limit (3) is denied: every key reaches the sketch
                await service.check_attributes(login(key)["attributes"], cost=4)

        await flood(0, 1_000)  # warm up: the sketch full, every dict at its size
        tracemalloc.start()
        try:
            before = tracemalloc.take_snapshot()
            await flood(1_000, 5_000)
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        grown = sum(
            s.size_diff
            for s in after.compare_to(before, "filename")
            if "ratewarden/server/_dash" in (s.traceback[0].filename if s.traceback else "")
        )
        assert len(stats.top.current) <= stats.top.capacity
        assert len(stats.top.previous) <= stats.top.capacity
        assert stats.top.current.total == 6_000  # every denial counted
        assert grown < 64 * 1024, f"the dashboard's modules grew by {grown} bytes"

    asyncio.run(main())


# -- the rates ---------------------------------------------------------------------------


@dataclass
class Counts:
    checks: dict[str, int] = field(default_factory=dict)
    over: dict[str, int] = field(default_factory=dict)
    near: dict[str, int] = field(default_factory=dict)
    shadow: dict[str, int] = field(default_factory=dict)
    errors: float = 0.0

    def stats(self, **options: Any) -> DashboardStats:
        counts = (self.checks, self.over, self.near, self.shadow)
        return DashboardStats(counts, lambda: self.errors, **options)


def test_a_sample_is_the_counters_difference_since_the_last() -> None:
    counts = Counts()
    stats = counts.stats()
    counts.checks["login"] = 5
    assert stats.sample(100.0) is None  # the baseline: what came before is not a rate
    counts.checks.update(login=12, search=3)
    counts.over["login"] = 4
    counts.shadow["watched"] = 2
    counts.checks["watched"] = 2
    counts.errors = 1.0
    stats.requests = 14
    point = stats.sample(101.0)
    assert point is not None
    assert point.rules == {"login": [3, 4, 0], "search": [3, 0, 0], "watched": [2, 0, 2]}
    assert (point.requests, point.denied, point.shadow, point.store_errors) == (14, 4, 2, 1)
    assert (point.t, point.dt, point.other) == (101.0, 1.0, None)
    quiet = stats.sample(102.5)
    assert quiet is not None
    assert (quiet.rules, quiet.requests, quiet.dt) == ({}, 0, 1.5)
    assert [p.t for p in stats.since(101.0)] == [102.5]
    assert [p.t for p in stats.since(0)] == [101.0, 102.5]


def test_rules_past_the_cap_are_summed_as_other() -> None:
    counts = Counts()
    stats = counts.stats(max_rules=2)
    stats.sample(0.0)
    counts.checks.update(a=10, b=5, c=3, d=1)
    counts.over.update(c=1)
    point = stats.sample(1.0)
    assert point is not None
    assert point.rules == {"a": [10, 0, 0], "b": [5, 0, 0]}
    assert point.other == [2 + 1, 1, 0]
    assert point.denied == 1  # the totals count the rules summed as other too


def test_history_is_bounded() -> None:
    counts = Counts()
    stats = counts.stats(history=5)
    for t in range(20):
        counts.checks["a"] = t
        stats.sample(float(t))
    assert [p.t for p in stats.points] == [15.0, 16.0, 17.0, 18.0, 19.0]


def test_the_service_hook_counts_requests_and_the_keys_it_denies(rules_file: Path) -> None:
    async def main() -> None:
        app = make_app(rules_file)
        async with client_for(app) as client:
            for _ in range(5):
                await client.post("/v1/check", json=login("198.51.100.9"))
            for _ in range(6):  # log_only: 4 a minute, then "would have denied"
                await client.post("/v1/check", json={"attributes": {"path": "/api/watched"}})
            await client.post("/v1/check", json={"attributes": {"path": "/nothing"}})
        stats = app.service.dashboard
        # every check but the one no rule applies to (per-user applies to the logins)
        assert stats.requests == 5 + 6
        top = {(e["rule"], e["key"]): e["denied"] for e in stats.top.top(10)}
        assert top == {("login", "198.51.100.9"): 2, ("watched", ""): 2}

    asyncio.run(main())


def test_a_reload_is_recorded_with_its_result(rules_file: Path) -> None:
    async def main() -> None:
        app = make_app(rules_file)
        stats = app.service.dashboard
        results: list[tuple[float, str | None] | None] = [stats.reloaded]
        await app.service.reload()
        results.append(stats.reloaded)
        rules_file.write_text("version: 1\nrules: [{name: x}]\n")
        with pytest.raises(Exception, match="rate"):
            await app.service.reload()
        results.append(stats.reloaded)
        assert results[0] is None
        assert results[1] is not None
        assert results[1][1] is None
        assert results[2] is not None
        assert "rate" in (results[2][1] or "")
        assert results[2][0] >= results[1][0]

    asyncio.run(main())


# -- the page ------------------------------------------------------------------------------


def test_the_page_and_its_files_are_served_without_a_token_under_a_strict_policy(
    rules_file: Path,
) -> None:
    async def main() -> None:
        async with client_for(make_app(rules_file, token=TOKEN)) as client:
            page = await client.get("/")
            assert page.status_code == 200
            assert page.headers["content-type"] == "text/html; charset=utf-8"
            assert page.headers["content-security-policy"] == CSP.decode()
            assert "script-src 'self'" in page.headers["content-security-policy"]
            assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
            assert page.headers["x-content-type-options"] == "nosniff"
            assert page.headers["cache-control"] == "no-store"
            assert "<script>" not in page.text  # no inline script: the policy would block it
            assert " style=" not in page.text
            linked = re.findall(r'(?:src|href)="(/[^"]*)"', page.text)
            assert sorted(linked) == sorted(p for p in Dashboard.ASSETS if p != "/")
            for path in linked:
                asset = await client.get(path)
                assert asset.status_code == 200, path
                assert asset.content
                assert asset.headers["x-content-type-options"] == "nosniff"
            script = (await client.get("/dashboard/app.js")).text
            assert "innerHTML" not in script  # service data goes in as text only
            assert "http://" not in script
            assert "https://" not in script  # no CDN, nothing from elsewhere
            refused = await client.get("/v1/events")
            assert refused.status_code == 401
            wrong_method = await client.post("/v1/events")
            assert wrong_method.status_code == 405
            assert wrong_method.headers["allow"] == "GET, HEAD"

    asyncio.run(main())


# -- the stream, through the ASGI app ---------------------------------------------------------


@dataclass
class Stream:
    task: asyncio.Task[None]
    sent: asyncio.Queue[dict[str, Any]]
    leave: asyncio.Event

    async def start(self) -> dict[str, Any]:
        return await asyncio.wait_for(self.sent.get(), 5)

    async def event(self) -> dict[str, Any]:
        message = await asyncio.wait_for(self.sent.get(), 5)
        assert message["type"] == "http.response.body"
        assert message["more_body"] is True
        text = message["body"].decode()
        assert text.startswith("event: snapshot\ndata: ")
        assert text.endswith("\n\n")
        decoded: dict[str, Any] = json.loads(text.split("data: ", 1)[1])
        return decoded


@asynccontextmanager
async def stream(app: App, headers: dict[str, str] | None = None) -> AsyncIterator[Stream]:
    sent: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    leave = asyncio.Event()
    asked = False

    async def receive() -> dict[str, Any]:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await leave.wait()
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        await sent.put(message)

    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {"type": "http", "method": "GET", "path": "/v1/events", "raw_path": b"/v1/events",
             "query_string": b"", "headers": raw, "client": ("127.0.0.1", 4000)}  # fmt: skip
    task = asyncio.ensure_future(app(scope, receive, send))
    try:
        yield Stream(task, sent, leave)
    finally:
        leave.set()
        await asyncio.wait_for(task, 5)


def fast_app(rules_file: Path, **options: Any) -> App:
    app = make_app(rules_file, token=TOKEN, **options)
    stats = app.service.dashboard
    stats.stop()  # started at 1 s by the app, built in a running loop; a stream starts it again
    stats.interval = 0.02  # samples come quickly; nothing waits for a boundary
    return app


def test_the_stream_sends_history_then_what_is_new_and_denials_as_they_happen(
    rules_file: Path,
) -> None:
    async def main() -> None:
        app = fast_app(rules_file)
        async with client_for(app) as client, stream(app, AUTH) as events:
            start = await events.start()
            assert start["status"] == 200
            assert (b"content-type", b"text/event-stream; charset=utf-8") in start["headers"]
            first = await events.event()
            assert first["rules"]["source"] == str(rules_file)
            assert [r["name"] for r in first["rules"]["rules"]][:2] == ["login", "per-user"]
            assert first["rules"]["rules"][0]["line"] == 6  # where the rule starts in the file
            assert first["store"] == {"type": "AsyncMemoryStore", "ok": True, "problem": None}
            assert first["quotas"] is None  # the memory store: no fleet quotas
            assert first["overrides"]["overrides"] == []
            second = await events.event()
            assert "rules" not in second  # unchanged: not sent again
            assert second["series"]
            assert all(p["t"] > first["series"][-1]["t"] for p in second["series"]) if (
                first["series"]) else True  # fmt: skip
            for _ in range(5):
                await client.post("/v1/check", json=login("192.0.2.1"), headers=AUTH)
            denied = 0
            while denied < 2:
                denied += sum(p["denied"] for p in (await events.event())["series"])
            assert denied == 2
            event = await events.event()
            assert event["top"]["keys"][0] == {"rule": "login", "key": "192.0.2.1", "denied": 2,
                                               "error": 0}  # fmt: skip
        assert app.dashboard.streams == 0

    asyncio.run(main())


def test_a_reload_sends_the_rules_again_with_its_result(rules_file: Path) -> None:
    async def main() -> None:
        app = fast_app(rules_file)
        async with stream(app, AUTH) as events:
            await events.start()
            assert (await events.event())["rules"]["reload"] is None
            rules_file.write_text("version: 1\nrules: [{name: x}]\n")
            with pytest.raises(Exception, match="rate"):
                await app.service.reload()
            while "rules" not in (event := await events.event()):
                pass
            reload = event["rules"]["reload"]
            assert reload["ok"] is False
            assert "rate" in reload["error"]
            assert event["rules"]["count"] == 5  # the rules in force stay

    asyncio.run(main())


def test_one_stream_more_than_allowed_is_refused_and_a_freed_place_is_taken(
    rules_file: Path,
) -> None:
    async def main() -> None:
        app = fast_app(rules_file)
        app.dashboard.max_streams = 2
        async with stream(app, AUTH) as one, stream(app, AUTH) as two:
            assert (await one.start())["status"] == 200
            assert (await two.start())["status"] == 200
            async with stream(app, AUTH) as three:
                refused = await three.start()
                assert refused["status"] == 503
                assert (b"retry-after", b"5") in refused["headers"]
                body = json.loads((await three.sent.get())["body"])
                assert "2 dashboards are open" in body["error"]
            assert app.dashboard.streams == 2
            one.leave.set()
            await asyncio.wait_for(one.task, 5)
            async with stream(app, AUTH) as four:
                assert (await four.start())["status"] == 200
        assert app.dashboard.streams == 0

    asyncio.run(main())


def test_a_stream_ends_when_its_client_goes_and_when_the_service_drains(
    rules_file: Path,
) -> None:
    async def main() -> None:
        app = fast_app(rules_file)
        async with stream(app, AUTH) as events:
            await events.start()
            await events.event()
            events.leave.set()
            await asyncio.wait_for(events.task, 5)  # no more sends into nothing
        async with stream(app, AUTH) as events:
            await events.start()
            await events.event()
            app.service.draining = True
            while (message := await asyncio.wait_for(events.sent.get(), 5))["more_body"]:
                pass
            assert message["body"] == b""  # ended cleanly, before the client went
            await asyncio.wait_for(events.task, 5)
        async with stream(app, AUTH) as events:
            assert (await events.start())["status"] == 503  # none opens while draining

    asyncio.run(main())


def test_no_stream_no_publisher(rules_file: Path) -> None:
    """The snapshot's I/O (health, quotas, overrides) runs only while someone watches."""

    async def main() -> None:
        app = fast_app(rules_file)
        async with stream(app, AUTH) as events:
            await events.start()
            await events.event()
            publisher = app.dashboard._publisher
            assert publisher is not None
            assert not publisher.done()
        await asyncio.wait_for(publisher, 5)
        assert app.service.dashboard.listeners == []

    asyncio.run(main())


def test_the_stats_read_the_metrics_counters_through_their_public_face() -> None:
    from ratewarden.server._metrics import Metrics  # noqa: PLC0415

    metrics = Metrics()
    stats = DashboardStats.for_metrics(metrics)
    assert metrics.store_error_count() == 0
    metrics.tally.store_errors += 2
    assert metrics.store_error_count() == 2
    assert stats._store_errors() == 2


def test_the_page_has_a_banner_for_a_store_that_does_not_answer() -> None:
    """The snapshot's ``store.ok`` shows or hides a banner at the top of the page."""
    folder = Path(__file__).resolve().parents[2] / "src" / "ratewarden" / "server" / "dashboard"
    page = (folder / "index.html").read_text()
    assert re.search(r'<p id="store-banner"[^>]* role="alert" hidden>', page)
    assert page.index('id="store-banner"') < page.index('id="login"')  # above everything
    script = (folder / "app.js").read_text()
    assert "banner.hidden = store.ok;" in script


def test_the_docs_say_what_each_part_of_the_page_shows() -> None:
    """docs/dashboard.md's table has a row for each part of the page: each titled
    card, and the store banner above them."""
    root = Path(__file__).resolve().parents[2]
    page = (root / "src" / "ratewarden" / "server" / "dashboard" / "index.html").read_text()
    main = page[page.index('<main id="main"') :]
    titles = {
        re.sub(r"<small.*", "", t).strip().lower() for t in re.findall(r"<h2>(.*?)</h2>", main)
    }
    docs = (root / "docs" / "dashboard.md").read_text()
    table = docs.partition("## What it shows\n\n")[2].partition("\n\n")[0]
    parts = {line.split("|")[1].strip() for line in table.strip().splitlines()[2:]}
    assert 'id="store-banner"' in page
    assert parts == titles | {"store banner"}
