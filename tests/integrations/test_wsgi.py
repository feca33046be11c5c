"""The WSGI middleware around a bare WSGI app, called as a server calls it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from ratewarden import FakeClock, Limiter, MemoryStore
from ratewarden.integrations.wsgi import RateLimitMiddleware
from ratewarden.rules import RuleEngine, loads

from .conftest import IDENTIFY_RULES, broken_identify, expect_unidentified


def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


def status_of(middleware: RateLimitMiddleware, path: str) -> int:
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "REMOTE_ADDR": "203.0.113.7"}
    seen: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        seen.append(status)

    b"".join(middleware(environ, start_response))
    return int(seen[0].split()[0])


def test_an_identify_that_raises_follows_the_rule_policy(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    engine = RuleEngine(loads(IDENTIFY_RULES), MemoryStore(clock=clock))
    middleware = RateLimitMiddleware(app, engine, identify=broken_identify)
    expect_unidentified(lambda path: status_of(middleware, path), caplog)


def test_a_plain_limiter_counts_the_address_when_identify_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    middleware = RateLimitMiddleware(app, Limiter("2/minute"), identify=broken_identify)
    assert [status_of(middleware, "/") for _ in range(3)] == [200, 200, 429]
    assert "identify raised LookupError" in caplog.text


def not_a_mapping(environ: Any) -> Any:
    return ["user"]


def test_an_identify_that_returns_no_mapping_is_logged(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    engine = RuleEngine(loads(IDENTIFY_RULES), MemoryStore(clock=clock))
    middleware = RateLimitMiddleware(app, engine, identify=not_a_mapping)
    assert status_of(middleware, "/private") == 503  # its user is unknown: fail_closed
    assert "identify must return a mapping of attributes or None" in caplog.text
