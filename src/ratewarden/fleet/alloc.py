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
minus what the others hold now, never below 0. `place` then lays the grant on
the line ``[0, total)`` in pieces that no other member's pieces overlap (see
`_share`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = [
    "ALLOCATORS",
    "MAX_PIECES",
    "MILLI",
    "Piece",
    "allocate",
    "grant",
    "place",
    "scaled",
    "with_spare",
    "within",
]

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


def with_spare(algorithm: str, total: int, wants: Sequence[int]) -> list[int]:
    """`allocate`'s targets, and for the demand-based algorithms, when the wants
    add up to less than the total, the rest split in ``n + 1`` equal parts, one
    on top of each member's target and one left free for a member that joins.
    A member whose callers wait for each permit before asking for the next (a
    pool of workers) asks only as fast as it is served: without the spare it
    would never be seen to want more. `static` keeps its caps, `equal` has none."""
    targets = allocate(algorithm, total, wants)
    if algorithm not in ("fair_share", "proportional_share") or not wants:
        return targets
    demand = 0
    for want in wants:
        demand += want
    if demand >= total:
        return targets
    base, extra = divmod(total - demand, len(wants) + 1)
    return [t + base + (1 if i < extra else 0) for i, t in enumerate(targets)]


def grant(target: int, total: int, others_hold: int) -> int:
    """The invariant: a member gets its target, but never more than the total
    minus what the others hold now, and never less than 0 (a negative grant would
    read as unlimited to a careless client)."""
    return max(0, min(target, total - others_hold))


Piece = tuple[int, int]  # a stretch of the line: (start, length), millipermits
MAX_PIECES = 128  # stretches a member's grant may lie in (see `place`)


def place(total: int, mine: Sequence[Piece], want: int, others: Sequence[Piece]) -> list[Piece]:
    """Where a member's grant lies on the line ``[0, total)``: its pieces, sorted.

    ``mine``: the member's pieces now; ``want``: the grant `grant` allows;
    ``others``: every other member's pieces, which it must not overlap. A member
    never moves another: the others' pieces are what they spend now, whatever
    changed since they were told. A smaller grant keeps the start of what it
    had (its lowest pieces); a larger one keeps all it had and grows into the
    free space next to its pieces, then into the largest free gaps, one new
    piece each, up to `MAX_PIECES`. It may end with less than ``want`` when the
    free space lies in more gaps than that.
    """
    has = 0
    for _, length in mine:
        has += length
    pieces = [[start, start + length] for start, length in sorted(mine)]
    if want <= has:
        kept, left = [], want
        for start, end in pieces:
            if left <= 0:
                break
            take = min(left, end - start)
            kept.append((start, take))
            left -= take
        return kept
    need = want - has
    gaps, at = [], 0
    for start, length in sorted([*others, *mine]):
        if start > at:
            gaps.append([at, start])
        at = max(at, start + length)
    if at < total:
        gaps.append([at, total])
    ends = {end for _, end in pieces}
    starts = {start for start, _ in pieces}
    for gap in gaps:  # next to its own pieces first
        if need == 0:
            break
        if gap[0] in ends:
            take = min(need, gap[1] - gap[0])
            pieces.append([gap[0], gap[0] + take])
            gap[0] += take
            need -= take
        if need and gap[1] > gap[0] and gap[1] in starts:
            take = min(need, gap[1] - gap[0])
            pieces.append([gap[1] - take, gap[1]])
            gap[1] -= take
            need -= take
    merged = _merge(pieces)
    for gap in sorted(gaps, key=lambda g: (g[0] - g[1], g[0])):  # the largest first
        if need == 0 or gap[1] <= gap[0] or len(merged) >= MAX_PIECES:
            break
        take = min(need, gap[1] - gap[0])
        merged = _merge([*merged, [gap[0], gap[0] + take]])
        need -= take
    return [(start, end - start) for start, end in merged]


def within(pieces: Sequence[Piece], space: Sequence[Piece]) -> bool:
    """Whether every piece of ``pieces`` lies inside one piece of ``space``."""
    return all(
        any(s <= start and start + length <= s + n for s, n in space) for start, length in pieces
    )


def common(pieces: Sequence[Piece], space: Sequence[Piece]) -> list[Piece]:
    """The parts of ``pieces`` that lie inside ``space``, in order."""
    out = []
    for start, length in sorted(pieces):
        for s, n in sorted(space):
            first, last = max(start, s), min(start + length, s + n)
            if first < last:
                out.append((first, last - first))
    return out


def scaled(pieces: Sequence[Piece], new_total: int, old_total: int) -> list[Piece]:
    """Pieces on a line cut from ``old_total`` to ``new_total``: each start and
    length scaled down (rounded down, so that pieces apart stay apart); the
    ones left empty dropped."""
    out = []
    for start, length in pieces:
        kept = length * new_total // old_total
        if kept > 0:
            out.append((start * new_total // old_total, kept))
    return out


def _merge(pieces: list[list[int]]) -> list[list[int]]:
    out: list[list[int]] = []
    for start, end in sorted(pieces):
        if out and out[-1][1] == start:
            out[-1][1] = end
        else:
            out.append([start, end])
    return out
