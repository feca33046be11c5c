"""The framework-free pieces: attributes, the lazy header views, replies."""

from __future__ import annotations

import logging

import pytest

from ratewarden import ConfigurationError, Decision
from ratewarden.integrations._request import IdentifyFailures, Responder, attributes
from ratewarden.integrations.asgi import ScopeHeaders, scope_attributes
from ratewarden.integrations.wsgi import EnvironHeaders, environ_attributes, status_line
from ratewarden.rules import Outcome, Response


def test_identity_overrides_and_extends() -> None:
    found = attributes("GET", "/x", "1.2.3.4", {}, identity={"user": "u", "ip": "9.9.9.9"})
    assert found == {"method": "GET", "path": "/x", "ip": "9.9.9.9", "headers": {}, "user": "u"}


def test_scope_headers_decode_once_and_join_repeats() -> None:
    scope = {
        "type": "http",
        "headers": [(b"x-forwarded-for", b"1.1.1.1"), (b"x-forwarded-for", b"2.2.2.2"),
                    (b"content-length", b"12")],
    }  # fmt: skip
    found = scope_attributes(scope, None)
    headers = found["headers"]
    assert isinstance(headers, ScopeHeaders)
    assert headers.get("x-forwarded-for") == "1.1.1.1, 2.2.2.2"
    assert headers.get("missing") is None
    assert len(headers) == 2
    assert sorted(headers) == ["content-length", "x-forwarded-for"]
    assert found["body_size"] == 12
    assert (found["method"], found["path"], found["ip"]) == ("GET", "/", None)


def test_environ_headers_are_a_view() -> None:
    environ = {
        "REQUEST_METHOD": "POST",
        "SCRIPT_NAME": "/app",
        "PATH_INFO": "/caf\xc3\xa9",  # PEP 3333: UTF-8 bytes as latin-1 text
        "REMOTE_ADDR": "10.0.0.1",
        "HTTP_X_API_KEY": "k1",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": "",
    }
    found = environ_attributes(environ, None)
    headers = found["headers"]
    assert isinstance(headers, EnvironHeaders)
    assert headers["x-api-key"] == "k1"
    assert headers["content-type"] == "application/json"
    assert "content-length" not in headers  # empty in the environ: absent
    assert dict(headers) == {"x-api-key": "k1", "content-type": "application/json"}
    assert len(headers) == 2
    assert found["path"] == "/app/café"
    assert "body_size" not in found


def test_status_lines() -> None:
    assert status_line(429) == "429 Too Many Requests"
    assert status_line(599) == "599 Unknown"


def test_responder_modes_and_a_cost_above_the_limit() -> None:
    with pytest.raises(ConfigurationError, match="headers must be one of"):
        Responder("some")  # type: ignore[arg-type]
    never = Decision(False, 10, 10, 0.0, float("inf"), "big")
    outcome = Outcome(False, "reject", never, status=429, retry_after=float("inf"))
    reply = Responder("none").refused(outcome)
    assert reply.status == 429
    assert ("Retry-After", "1") not in reply.headers  # no retry can ever pass: none promised
    assert b"costs more than a limit of 10 ever grants" in reply.body
    assert Responder("denied").passed(Outcome(True, "allow", never)) == []


def test_a_shadow_ban_header_outside_latin1_is_replaced_not_raised() -> None:
    response = Response(status=200, body="ok", headers={"X-Note": "café → ok"})
    outcome = Outcome(False, "shadow_ban", None, status=200, response=response)
    reply = Responder().refused(outcome)
    assert ("X-Note", "café ? ok") in reply.headers
    assert ("Content-Type", "text/plain; charset=utf-8") in reply.headers


def test_identify_failures_log_once_a_minute_per_type_within_bounds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    failures = IdentifyFailures(every=60.0, types=2, clock=lambda: now[0])
    caplog.set_level(logging.ERROR, "ratewarden.integrations")
    for _ in range(1000):
        failures.failed(KeyError("session"))
    assert [r.exc_info is not None for r in caplog.records] == [True]  # the traceback
    now[0] = 61.0
    failures.failed(KeyError("session"))
    assert "identify raised KeyError again" in caplog.records[-1].getMessage()
    assert "999 more since the last line" in caplog.records[-1].getMessage()
    assert caplog.records[-1].exc_info is None
    # a new type has a line of its own; at most ``types`` types are remembered
    for kind in (ValueError, TypeError, OSError):
        failures.failed(kind("x"))
        failures.failed(kind("x"))
    assert len(caplog.records) == 5
    assert len(failures) == 2


def test_identify_failures_settings_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="every must be > 0"):
        IdentifyFailures(every=0)
    with pytest.raises(ConfigurationError, match="types must be an integer >= 1"):
        IdentifyFailures(types=0)
