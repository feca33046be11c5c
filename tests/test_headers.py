from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratewarden import Decision, FakeClock, Limiter, MemoryStore
from ratewarden._headers import Policy, rate_limit_headers, retry_after_header, sf_string
from ratewarden.algorithms import ALGORITHMS


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


def _documented_header_table() -> list[list[str]]:
    """docs/algorithms.md's table of what the headers say, one list of cells a row."""
    page = (Path(__file__).parent.parent / "docs" / "algorithms.md").read_text()
    section = page.split("## What the headers say", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| `")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


Refill = Literal["continuous", "interval"]


def _six_at_second(second: int, algorithm: str, refill: Refill) -> list[dict[str, str]]:
    """The headers of six requests in a row to a 5/minute limit, at ``second`` of a minute."""
    clock = FakeClock(start=1_700_000_000 - 20 + second)  # the default start is second 20
    limiter = Limiter("5/minute", algorithm=algorithm, refill=refill,
                      store=MemoryStore(clock=clock), name="per-ip")  # fmt: skip
    return [dict(rate_limit_headers(limiter.hit("k"))) for _ in range(6)]


def test_the_documented_headers_of_each_algorithm() -> None:
    rows = _documented_header_table()
    named = [name for row in rows for name in re.findall(r"`(\w+)`", row[0])]
    assert sorted(set(named)) == sorted(ALGORITHMS)
    for row in rows:
        refill: Refill = "interval" if 'refill="interval"' in row[0] else "continuous"
        first_reset, denied_reset, retry = row[1:4]
        for algorithm in re.findall(r"`(\w+)`", row[0]):
            first, *_, sixth = _six_at_second(3, algorithm, refill)
            assert sixth.get("Retry-After") is not None, (algorithm, "the 6th is denied")
            got = [first["X-RateLimit-Reset"], sixth["X-RateLimit-Reset"], sixth["Retry-After"]]
            assert got == [first_reset, denied_reset, retry], (algorithm, refill)


@pytest.mark.parametrize("second", [0, 3, 30, 59])
def test_the_default_algorithms_headers_move_with_the_second(second: int) -> None:
    """docs/algorithms.md: at second s, sliding_window_counter's 120 - s and 72 - s."""
    first, *_, sixth = _six_at_second(second, "sliding_window_counter", "continuous")
    assert first["X-RateLimit-Reset"] == str(120 - second)
    assert sixth["Retry-After"] == str(72 - second)
