"""The checks of a rule's ``count`` and ``settle``: the rules whose hits are
settled after the request ran (`ratewarden.rules._settle`), and why the others
cannot be.

A settled hit is a reservation (`ratewarden.Limiter.reserve`): taken when the
request is checked, so a caller over the limit is refused before the request
runs, then corrected by the settle: given back when the response's status does
not count (``count``), or charged at the actual cost (``settle: true``). Every
algorithm can give a hit back (`ratewarden.algorithms.settle`); what cannot be
settled is a limit that is not one key's state in one store call, and the
actions whose hit is something else than a count:

- ``shards``, ``store: two_tier`` and ``adaptive`` limits: a sharded count, a
  count kept in this process, a count in units;
- ``log_only`` (its tiers are a second set that never denies), ``queue`` (a
  hit is a slot of a schedule) and ``degrade`` (a level, not a refusal).

A rule without a rate (a concurrency limit alone) has nothing to settle.
"""

from __future__ import annotations

import re
from typing import Protocol

from ._schema import CountBy, Rule

__all__ = ["check_settle", "statuses"]

_RANGE = re.compile(r"^\s*(\d{3})\s*-\s*(\d{3})\s*$")
_UNSETTLED_ACTIONS = {
    "log_only": "its limits are checked as a second set that never denies",
    "queue": "a queued request's hit is its slot in the line's schedule",
    "degrade": "a degrade rule sets a level and never refuses",
}


class _Bad(Protocol):
    def __call__(self, field: str, reason: str, path: str | None = None) -> None: ...


def statuses(listed: list[int | str]) -> tuple[tuple[int, int], ...]:
    """The (low, high) ranges, inclusive, of a ``count`` list; `ValueError`
    naming the first entry that is not a status (100 to 599) or a range of them."""
    ranges: list[tuple[int, int]] = []
    for entry in listed:
        if isinstance(entry, bool):
            raise ValueError(f"{entry!r} is not an HTTP status")
        if isinstance(entry, int):
            low = high = entry
        else:
            found = _RANGE.match(entry)
            if found is None:
                raise ValueError(f"{entry!r} is not a status or a range of them such as '500-599'")
            low, high = int(found[1]), int(found[2])
        if not 100 <= low <= high <= 599:
            raise ValueError(f"{entry!r} is not a status from 100 to 599 (a range low-high)")
        ranges.append((low, high))
    return tuple(ranges)


def _check_count(count: CountBy, bad: _Bad) -> None:
    if bool(count.status) == bool(count.not_status):
        bad("count", "'count' takes one of 'status' (count only these responses) or"
            " 'not_status' (count all but these), with a list such as [401, 403]"
            " or ['500-599']")  # fmt: skip
        return
    field = "status" if count.status else "not_status"
    try:
        statuses(count.status or count.not_status)
    except ValueError as exc:
        bad("count", f"count.{field}: {exc}")


def check_settle(rule: Rule, two_tier: bool, bad: _Bad) -> None:
    """Report what is wrong with ``rule``'s ``count`` and ``settle``
    (``two_tier``: the rule counts in this process, by its own store or the
    file's default)."""
    if rule.count is None and not rule.settle:
        return
    field = "count" if rule.count is not None else "settle"
    if rule.count is not None:
        _check_count(rule.count, bad)
    what = ("counts a request by its response" if field == "count"
            else "settles a request's cost after it ran")  # fmt: skip
    if not rule.rate:
        bad(field, f"this rule {what}, and has no rate to count it in")
    why = _UNSETTLED_ACTIONS.get(rule.action)
    if why is not None:
        bad(field, f"a rule that {what} cannot have action {rule.action!r}: {why}; use"
            " 'reject', 'delay' or 'shadow_ban'")  # fmt: skip
    for shape, present in (
        ("shards", rule.shards is not None and rule.shards > 1),
        ("store: two_tier", two_tier),
        ("adaptive", rule.adaptive is not None),
    ):
        if present:
            bad(field, f"a rule that {what} gives hits back in one key's state, in one store"
                f" call; {shape} cannot: leave it out, or the {field} out")  # fmt: skip
