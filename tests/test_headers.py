from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from ratewarden import Decision
from ratewarden._headers import Policy, rate_limit_headers, retry_after_header, sf_string


def test_allowed_headers() -> None:
    decision = Decision(True, 100, 37, 22.2, 0.0, "per-user")
    headers = rate_limit_headers(decision, [Policy("per-user", 100, 60), Policy("org", 1000, 3600)])
    assert headers == [
        ("X-RateLimit-Limit", "100"),
        ("X-RateLimit-Remaining", "37"),
        ("X-RateLimit-Reset", "23"),
        ("RateLimit-Policy", '"per-user";q=100;w=60, "org";q=1000;w=3600'),
        ("RateLimit", '"per-user";r=37;t=23'),
    ]


def test_denied_retry_after_never_early() -> None:
    denied = Decision(False, 5, 0, 10.0, 2.000001, "login")
    assert retry_after_header(denied) == "3"
    assert retry_after_header(Decision(False, 5, 0, 0.1, 0.1, "x")) == "1"  # never 0
    assert retry_after_header(Decision(False, 5, 0, 1.0, 1.0, "x")) == "1"  # exact stays
    assert retry_after_header(Decision(False, 5, 5, 0.0, math.inf, "x")) is None
    assert retry_after_header(Decision(True, 5, 4, 1.0, 0.0, "x")) is None
    names = [name for name, _ in rate_limit_headers(denied, legacy=False)]
    assert names == ["RateLimit", "Retry-After"]


def test_degraded_says_nothing_about_counts() -> None:
    closed = Decision(False, 5, 0, 0.25, 0.25, "x", degraded=True)
    assert rate_limit_headers(closed) == [("Retry-After", "1")]


def test_structured_field_strings() -> None:
    assert sf_string('a"b\\c') == '"a\\"b\\\\c"'
    assert sf_string("caf\u00e9\n") == '"caf??"'
    assert rate_limit_headers(Decision(True, 1, 0, 0.5, 0.0), [Policy("w", 1, 0.5)])[-2:] == [
        ("RateLimit-Policy", '"w";q=1;w=1'),
        ("RateLimit", '"default";r=0;t=1'),
    ]


@given(st.text())
def test_sf_string_fast_path_agrees_with_the_character_pass(text: str) -> None:
    safe = "".join(c if " " <= c <= "~" else "?" for c in text)
    assert sf_string(text) == '"' + safe.replace("\\", "\\\\").replace('"', '\\"') + '"'
