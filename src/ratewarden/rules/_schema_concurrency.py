"""The checks of a rule's ``concurrency`` and ``lease``: which options go with a
limit on requests in flight, and why the others do not.

A concurrency rule hands each request a slot (a lease) that the caller gives
back when the request ends (`ratewarden.rules._holds`). What a full limit can
do with a request is therefore: refuse it (``reject``, with its ``status``), or
let it wait for a slot (``delay`` with ``max_wait``). The actions that let a
request through without a slot, or answer it later from a schedule, have no
meaning for a slot: ``log_only`` would hand out slots that limit nothing,
``shadow_ban`` and ``degrade`` serve the request anyway, and ``queue`` is a
leaky bucket's schedule of a rate.
"""

from __future__ import annotations

import math
from typing import Protocol

from ._schema import Rule

__all__ = ["MAX_CONCURRENCY", "MAX_LEASE", "check_concurrency"]

MAX_CONCURRENCY = 1_000_000  # slots one key of a rule may hand out
MAX_LEASE = 86_400.0  # a day, as `ratewarden.ConcurrencyLimiter` allows

_NO_SLOT_ACTIONS = {
    "log_only": "it would hand out slots that limit nothing",
    "shadow_ban": "a shadow-banned request is answered at once and holds no slot",
    "degrade": "a degraded request is served anyway, so a full limit would not hold it back",
    "queue": "a queue is a leaky bucket's schedule of a rate, not a count of requests in flight",
}
# fields that shape how a rate is counted: without a rate they shape nothing
_RATE_FIELDS = ("algorithm", "burst", "store", "shards", "adaptive", "calendar", "queue")


class _Bad(Protocol):
    def __call__(self, field: str, reason: str, path: str | None = None) -> None: ...


def check_concurrency(rule: Rule, bad: _Bad) -> None:
    """Report what is wrong with ``rule``'s concurrency options; without them,
    a rule that has no rate either, or a ``lease`` that needs them."""
    if rule.concurrency is None:
        if not rule.rate:  # a rule judged whole: a misspelt 'rate' is said already
            bad("rate", "no rate: give one like '100/minute' or a list of them (or 'concurrency')")
        if rule.lease is not None:
            bad("lease", "'lease' goes with 'concurrency': how long a hold lasts unless released")
        return
    limit = rule.concurrency
    if not 1 <= limit <= MAX_CONCURRENCY:
        bad("concurrency", f"concurrency is how many requests of a key may be in flight at once,"
            f" 1 to {MAX_CONCURRENCY}, got {limit}")  # fmt: skip
    if rule.lease is not None and not (
        math.isfinite(rule.lease) and 0.001 <= rule.lease <= MAX_LEASE
    ):
        bad("lease", f"lease is seconds a hold lasts unless released, 0.001 to {MAX_LEASE:.0f},"
            f" got {rule.lease!r}")  # fmt: skip
    why = _NO_SLOT_ACTIONS.get(rule.action)
    if why is not None:
        bad("action", f"action {rule.action!r} cannot go with 'concurrency': {why}; use"
            " 'reject' (with 'status') or 'delay' (with 'max_wait', to wait for a slot)"
            + (", or a rule of its own for the rate" if rule.rate else ""))  # fmt: skip
    if rule.group is not None:
        bad("group", "a concurrency rule holds a slot for each request it matches, so it does not"
            " compete in a group: leave 'group' out (a rate of the group goes in a rule of its"
            " own)")  # fmt: skip
    if not rule.rate:
        if rule.cost != 1:
            bad("cost", "a request holds one slot of a concurrency limit: 'cost' counts against"
                " a rate, and this rule has none")  # fmt: skip
        for field in _RATE_FIELDS:
            if getattr(rule, field) is not None:
                bad(field, f"{field!r} shapes how a rate is counted, and this rule has no rate:"
                    " give 'rate' too, or leave it out")  # fmt: skip
        if rule.refill != "continuous":
            bad("refill", "'refill' shapes how a rate is counted, and this rule has no rate")
