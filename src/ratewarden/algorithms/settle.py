"""Settling a reservation: a pure change to a limit's state, no clock, no I/O.

A reservation is an admitted hit of an estimated cost; settling it applies
``delta = actual - estimate`` to the key's state. Each step function has its
settle, chosen by the step's name (`settler`):

``mark(new_state, now, params)``
    what identifies the window a reservation was counted in, taken from the
    state its admitting step left (the window's end; the admission tick for
    the log; nothing for a continuous bucket);
``settle(state, now, Change(delta, mark, estimate), params)``
    the state with ``delta`` applied (``estimate``: what was reserved). Its
    cases, the same for every algorithm:

    - an over-run (``delta > 0``) is charged to the window holding ``now``
      (the reservation's, or a later one), as far as that window can hold it:
      a window's count stops at its limit, a continuous bucket goes into debt
      down to ``-burst`` tokens (the step reads a bucket in debt correctly: it
      denies until the debt has drained), an interval bucket stops at empty;
      what goes past is not charged;
    - a refund (``delta < 0``) goes back to the window the reservation was
      counted in, only while that window is the current one, and never below
      zero used (never above the bucket's capacity); once the window has
      passed, a refund changes nothing. A continuous bucket has no windows:
      its refund gives back at most what of the estimate has not drained yet
      (the estimate less what the bucket refilled since it was reserved, as if
      the reservation drained first), and never fills the bucket past full;
    - the sliding log refunds by removing the reservation's own entries (those
      that leave the window at the reservation's tick plus the period), while
      they are in the window; an over-run adds entries at ``now``.

The leaky bucket and GCRA are the continuous bucket (see `bucket`), and settle
as it does. The Lua scripts (``stores/redis/lua/_settle.lua``) mirror these
functions exactly; tests/parity holds them to it.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, TypeAlias

from ._params import Params, State, Step
from .windows import fixed_window

__all__ = ["Change", "Mark", "Settle", "Settler", "settler"]

Mark: TypeAlias = Callable[[State, int, Params], int]


class Change(NamedTuple):
    """What a settle applies: ``delta`` (actual - estimate), the reservation's
    ``mark`` and its ``estimate``."""

    delta: int
    mark: int
    estimate: int


Settle: TypeAlias = Callable[[State | None, int, Change, Params], State | None]


@dataclass(frozen=True, slots=True)
class Settler:
    """The reservation functions of one step function (see the module docstring)."""

    name: str  # the step function's name, as the Lua scripts are named
    mark: Mark
    settle: Settle


def _window_mark(new: State, now: int, p: Params) -> int:
    return new[0]  # the window's end (fixed, calendar) or the refill tick (interval)


def _window_settler(step: Step) -> Settle:
    """Fixed windows, epoch-aligned or on a calendar: ``step`` at cost 0 rolls
    the state to the window holding ``now`` and counts nothing."""

    def settle(state: State | None, now: int, change: Change, p: Params) -> State | None:
        delta, mark, _ = change
        end, used = step(state, now, 0, p)[1]
        if delta > 0:
            return end, min(used + delta, p.limit)
        if end != mark:  # the reservation's window has passed: a refund is void
            return state
        return end, max(used + delta, 0)

    return settle


def _counter_mark(new: State, now: int, p: Params) -> int:
    return new[0] - p.period  # admitted: curr > 0, so the window ends at full_at - period


def _counter(state: State | None, now: int, change: Change, p: Params) -> State | None:
    delta, mark, _ = change
    period = p.period
    if state is None:
        end, prev, curr = now - now % period + period, 0, 0
    else:
        full_at, prev, curr = state
        end = full_at - period if curr else full_at
        if now >= end:  # roll to the window holding now, as the step does
            prev = curr if now < end + period else 0
            curr = 0
            end = now - now % period + period
    if delta > 0:
        weighted = prev * (end - now)
        # what the window still holds now: remaining as the step counts it
        room = p.limit - curr + (-weighted // period) if weighted else p.limit - curr
        curr += min(delta, max(room, 0))
    elif end == mark:
        curr = max(curr + delta, 0)
    else:
        return state
    full_at = end + period if curr else end if prev else now
    return full_at, prev, curr


def _log_mark(new: State, now: int, p: Params) -> int:
    return now  # the log's entries leave at now + period; a bucket drains from now


def _log(state: State | None, now: int, change: Change, p: Params) -> State | None:
    delta, mark, _ = change
    cut = 1 if state is None else bisect_right(state, now, 1)
    live = () if state is None else state[cut:]
    if delta > 0:
        added = min(delta, max(p.limit - len(live), 0))
        live = (*live, *((now + p.period,) * added))
    else:
        expiry = mark + p.period
        first = bisect_left(live, expiry)
        last = bisect_right(live, expiry)
        gone = min(-delta, last - first)  # none once the reservation's entries have left
        if not gone:
            return state
        live = live[:first] + live[first + gone :]
    return (live[-1], *live) if live else (now,)


def _bucket(state: State | None, now: int, change: Change, p: Params) -> State | None:
    delta, mark, estimate = change
    scale = p.scale
    debt = 0 if state is None or state[0] <= now else (state[0] - now) * scale - state[1]
    moved = delta * p.unit
    if delta < 0:  # no more than what of the estimate has not drained since ``mark``
        moved = max(moved, min(0, (now - mark) * scale - estimate * p.unit))
    # in debt down to -burst tokens at most; a refund never fills past full
    new_debt = min(max(debt + moved, 0), 2 * p.capacity)
    if new_debt == debt:
        return state
    if not new_debt:
        return (now, 0)
    wait = -(-new_debt // scale)
    return now + wait, wait * scale - new_debt


def _interval(state: State | None, now: int, change: Change, p: Params) -> State | None:
    delta, mark, _ = change
    if state is None or now >= state[0]:
        refill_at, left = now + p.period, p.burst
    else:
        refill_at, left = state
    if delta > 0:
        return refill_at, max(left - delta, 0)
    if refill_at != mark:  # refilled since the reservation: a refund is void
        return state
    return refill_at, min(left - delta, p.burst)


_SETTLERS = {
    "fixed_window": Settler("fixed_window", _window_mark, _window_settler(fixed_window)),
    "sliding_window_counter": Settler("sliding_window_counter", _counter_mark, _counter),
    "sliding_window_log": Settler("sliding_window_log", _log_mark, _log),
    "bucket": Settler("bucket", _log_mark, _bucket),
    "token_bucket_interval": Settler("token_bucket_interval", _window_mark, _interval),
}


def settler(step: Step) -> Settler:
    """The settle functions of ``step``: by its name, or a calendar's fixed
    window (whose windows only its step knows: it rolls the state)."""
    found = _SETTLERS.get(step.__name__)
    if found is not None:
        return found
    if step.__name__ == "calendar_window":
        return Settler("calendar_window", _window_mark, _window_settler(step))
    raise ValueError(f"no settle for the step function {step.__name__!r}")
