"""The live dashboard: its static page at ``/`` and the Server-Sent Events
stream at ``/v1/events`` that feeds it.

The page (HTML, JS and CSS shipped in the package, no CDN, no build step)
holds no data and is served to anyone, under a Content-Security-Policy that
allows nothing but its own files; everything it shows comes from
``/v1/events`` and the overrides API, with the bearer token the operator gives
it. The browser sends that token in an ``Authorization`` header (the page
reads the stream with ``fetch``, as EventSource cannot send headers), never in
a cookie, so another site cannot make a browser use it.

The stream sends one ``snapshot`` event a sample (a second): the points of
rates the client has not had yet (on connecting, the whole history), the top
limited keys, the store's health, the fleet quotas, the overrides, and the
rules in force when they changed since the client last had them. One
publisher gathers what needs I/O (health, quotas, overrides, each within
`PART_TIMEOUT`) once for every stream, and runs only while a stream is open.

Bounded whatever clients do: at most ``max_streams`` streams at once (one more
is answered 503), a stream ends when its client goes away (a client that stops
reading is dropped by the listener's write timeout) and when the service
drains, and every list a snapshot carries has a cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from importlib import resources
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec

from ..primitives import RatewardenError
from ._admin_api import override_list
from ._http_input import HTTPError
from ._quotas import summary
from ._readiness import store_problem

if TYPE_CHECKING:
    from ._dashstats import DashboardStats, Point
    from ._local_quotas import LocalQuotas
    from ._quota_reader import QuotaReader
    from ._readiness import StoreHealth
    from ._rules_in_force import RulesInForce

__all__ = ["MAX_OVERRIDES", "MAX_STREAMS", "Dashboard"]

log = logging.getLogger("ratewarden.server")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Answer = tuple[int, list[tuple[bytes, bytes]], bytes]

MAX_STREAMS = 8  # dashboards open at once, each process
PART_TIMEOUT = 2.0  # seconds the health, quotas or overrides of one snapshot may take
MAX_TOP = 20  # keys shown
MAX_RULES_LISTED = 500  # rules in force listed (a rule file may hold 10,000)
MAX_QUOTAS = 20  # fleet quotas shown, by name
MAX_MEMBERS = 50  # members shown a quota, by id
MAX_AUDIT = 20  # the overrides' latest changes shown
MAX_OVERRIDES = 100  # overrides shown (one a rule, and a rule file may hold 10,000)

# the page may load its own script and style and talk to its own origin, nothing else
CSP = (
    b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    b"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_SECURITY = [
    (b"content-security-policy", CSP),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]
_ASSETS = {
    "/": ("index.html", b"text/html; charset=utf-8"),
    "/dashboard/app.js": ("app.js", b"text/javascript; charset=utf-8"),
    "/dashboard/app.css": ("app.css", b"text/css; charset=utf-8"),
    "/dashboard/icon.svg": ("icon.svg", b"image/svg+xml"),
}
_encode = msgspec.json.Encoder().encode


def _read_assets() -> dict[str, tuple[bytes, bytes]]:
    folder = resources.files("ratewarden.server").joinpath("dashboard")
    return {path: (folder.joinpath(name).read_bytes(), kind)
            for path, (name, kind) in _ASSETS.items()}  # fmt: skip


class Dashboard:
    """The page and the event stream of one `App`."""

    ASSETS = tuple(_ASSETS)
    STREAM_HEADERS: ClassVar[list[tuple[bytes, bytes]]] = [
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"cache-control", b"no-store"), (b"x-accel-buffering", b"no"),
        (b"x-content-type-options", b"nosniff")]  # fmt: skip

    def __init__(
        self, stats: DashboardStats, rules: RulesInForce, health: StoreHealth,
        quotas: QuotaReader | LocalQuotas | Callable[[], QuotaReader | LocalQuotas | None] | None,
        *, max_streams: int = MAX_STREAMS,
    ) -> None:  # fmt: skip
        if type(max_streams) is not int or max_streams < 1:
            raise ValueError(f"max_streams must be an integer >= 1, got {max_streams!r}")
        self.stats = stats
        self.rules = rules
        self.health = health
        # where the quotas are read, asked at each snapshot (the rules' rlqs
        # section may come and go with a reload on the memory store)
        self.quotas = quotas if callable(quotas) or quotas is None else (lambda: quotas)
        self.max_streams = max_streams
        self.streams = 0
        self._assets = _read_assets()
        self._published = asyncio.Event()
        self._shared = b""  # the last snapshot's parts that are the same for every stream
        self._rules: tuple[object, bytes] = (None, b"")  # (what they were made from, JSON)
        self._publisher: asyncio.Task[None] | None = None
        self._single: tuple[object, bytes] = (None, b"")  # the latest point alone, encoded
        with contextlib.suppress(RuntimeError):  # built in a running loop: sample from now on
            asyncio.get_running_loop()
            self.stats.start()

    # -- the page -------------------------------------------------------------------------

    def asset(self, path: str) -> Answer:
        body, kind = self._assets[path]
        return 200, [(b"content-type", kind), *_SECURITY], body

    # -- the stream -----------------------------------------------------------------------

    async def stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer ``GET /v1/events``. Raises `HTTPError` only before the answer
        has started (503: draining, or as many streams as allowed are open)."""
        if self.health.draining:
            raise HTTPError(503, "the service is draining", [(b"retry-after", b"5")])
        if self.streams >= self.max_streams:
            raise HTTPError(503, f"{self.max_streams} dashboards are open, as many as this "
                            "process serves at once", [(b"retry-after", b"5")])  # fmt: skip
        self.streams += 1
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            self.stats.start()
            if self._publisher is None or self._publisher.done():
                self._published = asyncio.Event()  # of this loop, and not yet set
                self._publisher = asyncio.ensure_future(self._publish())
            await send({"type": "http.response.start", "status": 200,
                        "headers": self.STREAM_HEADERS})  # fmt: skip
            sent: Point | None = None  # the last sample this client has
            rules_sent: object = None
            if not self._shared:
                await _first(self._published.wait(), gone)
            while self._going_on(gone):
                series = self._series(sent)
                made_from, rules = self._rules
                parts = [b'{"series":', series]
                if made_from is not rules_sent:
                    parts += [b',"rules":', rules]
                    rules_sent = made_from
                parts += [b",", self._shared[1:]]
                body = b"event: snapshot\ndata: " + b"".join(parts) + b"\n\n"
                if self.stats.points:
                    sent = self.stats.points[-1]
                await send({"type": "http.response.body", "body": body, "more_body": True})
                await _first(self._published.wait(), gone)
            if not gone.done():
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self.streams -= 1
            gone.cancel()

    def _going_on(self, gone: asyncio.Future[None]) -> bool:
        """Whether a stream has more to send: its client is there, the service
        is not draining, and the publisher runs."""
        return not gone.done() and not self.health.draining and bool(self._shared)

    def _series(self, sent: Point | None) -> bytes:
        """The samples after ``sent`` (all of them if it is gone from the history).
        Told by the sample itself, not its time: the wall clock that stamps
        samples may be stepped back, and a stream that waited for a time it had
        seen would send nothing until the clock came back there."""
        points = self.stats.points
        if not points or points[-1] is sent:
            return b"[]"
        if len(points) < 2 or points[-2] is sent:
            latest = points[-1]  # the usual case: one new point, encoded once for every stream
            if self._single[0] is not latest:
                self._single = (latest, _encode([latest]))
            return self._single[1]
        new: list[Point] = []
        for point in reversed(points):
            if point is sent:
                break
            new.append(point)
        new.reverse()
        return _encode(new)

    async def _publish(self) -> None:
        """While a stream is open: after each sample, gather the snapshot's shared
        parts and wake the streams."""
        sampled = asyncio.Event()
        listener = sampled.set
        self.stats.listeners.append(listener)
        try:
            while self.streams:
                shared = await self.snapshot()
                self._shared = _encode(shared)
                self._rules_part()
                published, self._published = self._published, asyncio.Event()
                published.set()
                sampled.clear()
                await sampled.wait()
        except Exception:  # never silently: a dashboard that stops updating says why here
            log.exception("dashboard: the event publisher failed")
            raise
        finally:
            self.stats.listeners.remove(listener)
            self._shared = b""
            self._published.set()  # streams waiting see that nothing will come

    async def snapshot(self) -> dict[str, Any]:
        """The parts of an event every stream shares (the rules aside)."""
        store = self.health.store
        health, quotas, overrides = await asyncio.gather(
            _within(store_problem(store), "the store's health"),
            _within(self._quotas(), "the fleet quotas"),
            _within(self._overrides(), "the overrides"),
        )
        top = self.stats.top
        return {
            "t": time.time(),
            "pid": os.getpid(),
            "interval": self.stats.interval,
            "top": {"keys": top.top(MAX_TOP), "window": top.window, "denials": top.counted},
            "store": {
                "type": type(store).__name__,
                "ok": health is None,
                "problem": health["error"] if isinstance(health, dict) else health,
            },
            "quotas": quotas,
            "overrides": overrides,
            "draining": self.health.draining,
        }

    def _rules_part(self) -> None:
        rules_in_force = self.rules
        ruleset = rules_in_force.engine.ruleset
        envoy = rules_in_force.envoy
        made_from = (ruleset, envoy, self.stats.reloaded)
        if self._rules[0] == made_from:
            return
        reloaded = self.stats.reloaded
        rules = [
            {
                "name": rule.name,
                "line": rule.line,
                "action": rule.action,
                "rates": [str(spec.file_rate) for spec in rule.limits],
                "algorithm": rule.limits[0].algorithm if rule.limits else None,
                "by": list(rule.by),
                "group": rule.group,
                "description": rule.rule.description,
            }
            for rule in ruleset.rules[:MAX_RULES_LISTED]
        ]
        part = {
            "source": ruleset.source,
            "domain": rules_in_force.domain,
            "count": len(ruleset.rules),
            "rules": rules,
            "envoy_domains": [] if envoy is None else sorted(envoy.domains),
            "loaded_at": self.stats.loaded_at,
            "reload": None if reloaded is None else {
                "at": reloaded[0], "ok": reloaded[1] is None, "error": reloaded[1]},
        }  # fmt: skip
        self._rules = (made_from, _encode(part))

    async def _quotas(self) -> dict[str, Any] | None:
        reader = None if self.quotas is None else self.quotas()
        if reader is None:
            return None  # the memory store without rlqs buckets: no quotas
        statuses, truncated = await reader.read(MAX_QUOTAS)
        shown = []
        for status in statuses:
            figures = summary(status)
            members = sorted(status.members, key=lambda m: m.id)
            figures["members_shown"] = [m.as_dict() for m in members[:MAX_MEMBERS]]
            shown.append(figures)
        return {"quotas": shown, "truncated": truncated}

    async def _overrides(self) -> dict[str, Any]:
        answer: dict[str, Any] = msgspec.to_builtins(await override_list(self.rules.engine))
        overrides = answer.get("overrides", [])
        answer["overrides"] = overrides[:MAX_OVERRIDES]
        answer["more"] = max(len(overrides) - MAX_OVERRIDES, 0)
        answer["audit"] = answer.get("audit", [])[:MAX_AUDIT]
        return answer

    def __repr__(self) -> str:
        return f"<Dashboard {self.streams}/{self.max_streams} streams, {self.stats!r}>"


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _first(waiting: Awaitable[object], gone: asyncio.Future[None]) -> None:
    """Wait for ``waiting`` or for the client to go, whichever comes first."""
    task = asyncio.ensure_future(waiting)
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        task.cancel()


async def _within(part: Awaitable[Any], what: str) -> Any:
    """A part of the snapshot, or ``{"error": ...}`` when it fails or is late."""
    try:
        async with asyncio.timeout(PART_TIMEOUT):
            return await part
    except TimeoutError:
        return {"error": f"{what} took more than {PART_TIMEOUT:g} s"}
    except (RatewardenError, OSError) as exc:
        return {"error": f"{what}: {exc}"}
