"""What a provider says remains of its limit, read from its answer's headers.

Three spellings are read, the first found wins:

- the IETF draft's structured ``RateLimit: "name";r=REMAINING;t=SECONDS`` (one
  item per limit: the one with the least remaining counts), with
  ``RateLimit-Policy: "name";q=QUOTA;w=WINDOW`` for the quota;
- its earlier drafts' ``RateLimit-Remaining``, ``RateLimit-Reset`` (seconds)
  and ``RateLimit-Limit``;
- the common ``X-RateLimit-Remaining``, ``X-RateLimit-Reset`` and
  ``X-RateLimit-Limit``, whose reset is seconds from now or, above 10^9, a Unix
  time (GitHub's, for one).

A value that does not read as a whole number is ignored, as is an answer
without a remaining count: what a provider does not say is not guessed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Budget", "read_budget"]

Header = Callable[[str], str | None]

# Seconds a reset may be away at most: a bogus value must not stop a key for good.
MAX_RESET = 86_400.0
# A reset above this is a Unix time, not seconds from now (2001-09-09 onwards).
UNIX_TIME = 1_000_000_000
_ITEM = re.compile(r'^\s*(?:"[^"]*"|[A-Za-z*][A-Za-z0-9_.*:/%-]*)\s*((?:;[^;,]*)*)\s*$')


@dataclass(frozen=True, slots=True)
class Budget:
    """``remaining`` requests until ``reset`` seconds from the answer; ``limit``
    the quota of a window, when the provider says it (None otherwise)."""

    remaining: int
    reset: float
    limit: int | None


def _whole(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 15:
        return None
    return int(text)


def _seconds(text: str | None) -> float | None:
    """Seconds as a provider writes them: whole (``30``) or with a fraction (``1.5``)."""
    if text is None:
        return None
    whole, dot, fraction = text.strip().partition(".")
    if _whole(whole) is None or (dot and _whole(fraction) is None):
        return None
    return float(text)


def _params(item: str) -> dict[str, str]:
    """The ``;key=value`` parameters of one structured-field item."""
    match = _ITEM.match(item)
    if match is None:
        return {}
    found = {}
    for part in match[1].split(";")[1:]:
        key, _, value = part.partition("=")
        found[key.strip().lower()] = value.strip()
    return found


def _structured(header: Header) -> tuple[int, float, int | None] | None:  # (left, reset, quota)
    """``RateLimit`` (and ``RateLimit-Policy``) of the current IETF draft."""
    value = header("ratelimit")
    if value is None:
        return None
    least: tuple[int, float] | None = None
    for item in value.split(","):
        params = _params(item)
        remaining, reset = _whole(params.get("r")), _seconds(params.get("t"))
        if remaining is None:
            continue
        if least is None or remaining < least[0]:
            least = (remaining, float(reset or 0))
    if least is None:
        return None
    quotas = [
        _whole(_params(item).get("q")) for item in (header("ratelimit-policy") or "").split(",")
    ]
    limit = min((q for q in quotas if q is not None), default=None)
    return least[0], least[1], limit


def read_budget(header: Header, now: float) -> Budget | None:
    """What the answer whose headers ``header`` reads (by lower-case name) says
    remains; ``now`` is the Unix time, for a reset given as one."""
    found: tuple[int, float, int | None] | None = _structured(header)
    if found is None:
        for prefix in ("ratelimit-", "x-ratelimit-"):
            remaining = _whole(header(prefix + "remaining"))
            if remaining is not None:
                given = _seconds(header(prefix + "reset"))
                seconds = 0.0 if given is None else given
                if seconds > UNIX_TIME:
                    seconds = max(0.0, seconds - now)
                found = remaining, seconds, _whole(header(prefix + "limit"))
                break
    if found is None:
        return None
    remaining, reset, limit = found
    return Budget(remaining, min(reset, MAX_RESET), limit)
