"""How a fleet quota's total is split among its members: pure functions, no I/O.

Every quantity is an integer count of *millipermits per window* (a thousandth of a
permit), so that Python here and the coordinator's Lua (``fleet.lua``, whose
numbers are doubles, exact below 2^53) compute the same grants bit for bit: the
parity suite compares them. Members come sorted by id, the order both sides sum in.

- ``equal``: the total over the live members, whatever they want (the remainder
  millipermits go one each to the first members, so the grants sum to the total);
- ``proportional_share``: what each wants while the wants fit; in overload every
  member gets at least the equal share or what it wants if less, and the capacity
  left by those wanting less is split among the others in proportion to how much
  they want beyond the equal share (YouTube Doorman's ProportionalShare: capacity
  120, wants 1000/50/10 gives about 69.7/40.3/10);
- ``fair_share``: max-min fairness by water-filling: nobody gets more than it wants,
  and the members wanting more than the level all get the level (capacity 100,
  wants 1/30/34/1000 gives 1/30/34/35; Doorman's two-round version gives 34.5 to
  the member wanting 34);
- ``static``: each member what it wants, up to a fixed cap.

`grant` applies the safety invariant to one member's target: at most the total
minus what the others hold now, never below 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["ALLOCATORS", "MILLI", "allocate", "grant"]

MILLI = 1000  # millipermits in a permit

ALLOCATORS = ("equal", "proportional_share", "fair_share", "static")


def _equal(total: int, wants: Sequence[int]) -> list[int]:
    base, extra = divmod(total, len(wants))
    return [base + (1 if i < extra else 0) for i in range(len(wants))]


def _proportional(total: int, wants: Sequence[int]) -> list[int]:
    demand = 0
    for want in wants:
        demand += want
    if demand <= total:
        return list(wants)
    equal = total / len(wants)
    left = 0.0
    excess = 0.0
    for want in wants:
        if want <= equal:
            left += equal - want
        else:
            excess += want - equal
    return [
        want if want <= equal else math.floor(equal + left * (want - equal) / excess)
        for want in wants
    ]


def _fair(total: int, wants: Sequence[int]) -> list[int]:
    demand = 0
    for want in wants:
        demand += want
    if demand <= total:
        return list(wants)
    remaining, count = total, len(wants)
    level = 0
    for want in sorted(wants):
        level = remaining // count
        if want > level:
            break
        remaining -= want
        count -= 1
    return [min(want, level) for want in wants]


def allocate(algorithm: str, total: int, wants: Sequence[int], cap: int = 0) -> list[int]:
    """Each member's target grant (millipermits per window), members in id order.

    ``total`` and ``wants`` in millipermits per window; ``cap`` is the per-member
    cap of ``static``. The targets sum to at most ``total`` and, but for
    ``equal``, none exceeds what its member wants.
    """
    if not wants:
        return []
    if algorithm == "equal":
        return _equal(total, wants)
    if algorithm == "proportional_share":
        return _proportional(total, wants)
    if algorithm == "fair_share":
        return _fair(total, wants)
    if algorithm == "static":
        return [min(want, cap) for want in wants]
    raise ValueError(f"unknown allocation algorithm {algorithm!r}")


def grant(target: int, total: int, others_hold: int) -> int:
    """The invariant: a member gets its target, but never more than the total
    minus what the others hold now, and never less than 0 (a negative grant would
    read as unlimited to a careless client)."""
    return max(0, min(target, total - others_hold))
