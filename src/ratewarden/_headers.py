"""Rate-limit response headers from Decisions: no I/O, no framework.

Every front end (ASGI/WSGI middleware, the service's gateway endpoint) answers
with the same fields, built here once:

- ``X-RateLimit-Limit`` / ``-Remaining`` / ``-Reset`` (seconds until the limit is
  whole again), the de facto trio;
- the IETF ``RateLimit-Policy`` (every limit that applied: ``"name";q=100;w=60``)
  and ``RateLimit`` (the limit closest to denying: ``"name";r=37;t=23``), in
  structured-field syntax (RFC 8941 strings, integers);
- ``Retry-After`` in whole seconds, rounded up: never earlier than the moment a
  retry passes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from typing import NamedTuple

from ._decision import Decision

__all__ = [
    "Policy",
    "policy_item",
    "rate_limit_fields",
    "rate_limit_headers",
    "retry_after_header",
    "sf_string",
]

_INF = math.inf


class Policy(NamedTuple):
    """A limit as ``RateLimit-Policy`` names it: ``quota`` units per ``window`` seconds."""

    name: str
    quota: int
    window: float


def sf_string(text: str) -> str:
    """``text`` as an RFC 8941 string: quoted, ``\\`` and ``"`` escaped, and any
    character outside printable ASCII (which the syntax cannot carry) as ``?``."""
    if not (text.isascii() and text.isprintable()):  # rare: rule names are ASCII
        text = "".join(c if " " <= c <= "~" else "?" for c in text)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@functools.lru_cache(maxsize=4096)  # a service has few limits; each formats once
def policy_item(name: str, quota: int, window: float) -> str:
    """One limit's item of ``RateLimit-Policy``: ``"name";q=100;w=60``."""
    return f"{sf_string(name)};q={quota};w={max(1, math.ceil(window))}"


def _policy_item(policy: Policy) -> str:
    return policy_item(policy.name, policy.quota, policy.window)


_name_item = functools.lru_cache(maxsize=4096)(sf_string)  # limit names: few, each quoted once


def _seconds(value: float) -> int:
    """Whole seconds, rounded up (a header never promises a moment too early)."""
    return math.ceil(value) if math.isfinite(value) else 0


def retry_after_header(decision: Decision) -> str | None:
    """``Retry-After`` for a denial: whole seconds rounded up, at least 1; None when
    allowed, or when no retry can ever pass (a cost above the limit)."""
    if decision.allowed or not math.isfinite(decision.retry_after):
        return None
    return str(max(1, math.ceil(decision.retry_after)))


def rate_limit_headers(
    decision: Decision,
    policies: Iterable[Policy] = (),
    *,
    legacy: bool = True,
    ietf: bool = True,
) -> list[tuple[str, str]]:
    """The headers for ``decision`` (the tier that speaks for the request) and the
    ``policies`` that applied; ``legacy``: the X-RateLimit-* trio, ``ietf``: the
    RateLimit fields. A degraded Decision (the store could not count) says nothing
    about counts, so it gets no count headers."""
    listed = ", ".join([_policy_item(p) for p in policies]) if ietf else ""
    return list(rate_limit_fields(decision, listed, legacy=legacy, ietf=ietf).items())


def rate_limit_fields(
    decision: Decision, policy: str, *, legacy: bool = True, ietf: bool = True
) -> dict[str, str]:
    """`rate_limit_headers` by name, as the service writes them, with
    ``RateLimit-Policy``'s value given whole (`policy_item`\\ s joined by ", ";
    empty: no such field). Written flat: every answer of the service makes it."""
    headers: dict[str, str] = {}
    if not decision.degraded:
        after = decision.reset_after
        reset = math.ceil(after) if after < _INF else 0  # `_seconds`, inline
        remaining = decision.remaining if decision.remaining > 0 else 0
        if legacy:
            headers["X-RateLimit-Limit"] = str(decision.limit)
            headers["X-RateLimit-Remaining"] = str(remaining)
            headers["X-RateLimit-Reset"] = str(reset)
        if ietf:
            if policy:
                headers["RateLimit-Policy"] = policy
            name = _name_item(decision.rule or "default")
            headers["RateLimit"] = f"{name};r={remaining};t={reset}"
    if not decision.allowed and decision.retry_after < _INF:  # `retry_after_header`, inline
        headers["Retry-After"] = str(max(1, math.ceil(decision.retry_after)))
    return headers
