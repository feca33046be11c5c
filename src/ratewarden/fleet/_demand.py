"""A member's demand on its share of a fleet quota, measured for its reports
to the coordinator: no I/O, no locks, no clock. `_share.Share` owns one and
tells it of every call.

What the member reports back: ``used``, the permits it spent a window, and
``wants``, the permits a window its callers would spend if nothing held them
back. Each call counts once, whether it got a permit, waited or gave up, so
callers that give up show demand beyond the grant by asking more than was
spent. A caller that comes back (the same thread or task: ``caller`` in `ask`
and `done`) shows what its waiting cost it: its last call took ``W`` from asking
to returning (the wait), and it asked again ``Z`` after that (its own work).
Unhindered it would ask every ``Z``, so its call counts ``(W + Z) / Z`` times. A
pool of workers blocked on ``acquire`` asks only as fast as it is served, yet
reads as wanting far more than it holds, while callers that wait little or
work long count about once, as open-loop callers do. A caller that has waited
for more than half the period counts as one that would come back at once: a
pool that has not been served yet is seen too. The part that only waiting adds
is capped at the total: nobody can spend more. A rate from a handful of calls
is noise, so earlier periods (up to four) join in until the estimate rests on
20 calls, but only while their rate could have given the calls counted now:
callers that stopped have stopped.

Paced, a window is two parts: within `margin` of its edges, where nobody spends,
and between them. A member's calls follow that cycle: a caller that comes back
waits through the margins and asks only between them, while calls that arrive
on their own keep arriving within them. A rate measured over part of a window
therefore depends on which part the period covered; a period that covers the
margins would read a blocked pool as wanting a few permits, and the coordinator
would take its space at once and give it back from the next window edge only,
to be spent by nobody meanwhile. So each part's rate is measured over the
period's time in it, and a window's demand is each rate times the part's length
in a window: the same figure whatever part of a window the period covers.
Earlier periods join as above, whole, while each part's calls could come from
their rate; a part that the periods joined did not see is read from the latest
period that saw it while the other part's demand holds (its calls could come
from the last report's rate), else at the other part's rate. What waiting hid
would have been asked between the margins, for only a wait's part there counts
(a caller still waiting at a report too), so it counts there.
"""

from __future__ import annotations

import math
from collections import deque

__all__ = ["Demand"]

MILLI = 1000
# a period's calls, what their waiting hid and ns between the margins, and its
# calls and ns within them (see the module docstring)
Period = tuple[int, float, int, int, int]
SAMPLE = 20  # calls a demand estimate wants at least (else earlier periods join in)
STEADY = 0.02  # a demand that moves less than this (or one call) has not moved
CALLERS = 4096  # callers remembered between their calls, at most
WAKE_NS = 2_000_000  # how late a busy machine's event loop or thread wakes a sleeper


class Demand:
    """What one member's callers ask of its share, and what they would ask if
    nothing held them back (see the module docstring). Times are integer
    nanoseconds of the member's clock."""

    __slots__ = (
        "_calls",
        "_edge",
        "_joined_mid",
        "_returns",
        "asked",
        "asked_near",
        "extra",
        "history",
        "last",
        "latest_near",
        "pace",
        "period_start",
        "strict",
        "window_ns",
    )

    def __init__(self, window_ns: int, edge: int, *, pace: bool, strict: bool, now: int) -> None:
        self.window_ns = window_ns
        self._edge = edge  # paced, not strict: how far from a window's edges nothing is spent
        self.pace, self.strict = pace, strict
        self.asked = 0  # permits asked for since the last report
        self.extra = 0.0  # what the callers' waiting hid of their demand, since then
        self.asked_near = 0  # paced: the part of asked within `margin` of an edge
        self._calls: dict[object, tuple[int, int]] = {}  # caller: its call's start, cost
        # caller: its last call's wait (not counted yet), end and cost
        self._returns: dict[object, tuple[int, int, int]] = {}
        self.last: tuple[int, int] | None = None  # wants and used last reported
        # earlier periods: asked, what waiting hid, ns, between the margins; and
        # asked, ns, within them (paced); the latest period that had time there
        self.history: deque[Period] = deque(maxlen=4)
        self.latest_near: Period | None = None
        self._joined_mid = (0, 0)  # the last report's calls and ns between the margins
        self.period_start = now

    def ask(self, now: int, cost: int, caller: object, interval: int) -> None:
        """A call for ``cost`` permits begins (counted once, whatever comes of
        it); ``caller``: who makes it (a thread, a task), to see it come back;
        ``interval``: the share's spacing of paced permits now."""
        self.asked += cost
        edge = self._edge
        if edge and (now + edge) % self.window_ns < 2 * edge:
            self.asked_near += cost
        if caller is None:
            return
        last = self._returns.pop(caller, None)
        if last is not None:
            waited, ended, last_cost = last
            work = max(now - ended, self.window_ns // 1000)  # its own time between calls
            # paced, a wait up to one spacing is the schedule's, not a lack of
            # permits: a caller that arrives at random waits half a spacing on
            # average however large the grant, and counting it would inflate
            # the demand of one whose calls follow a schedule of their own
            # and so is a wait's part near a window's edge, where nothing is spent,
            # and the lateness of a busy machine's event loop or thread waking:
            # one that serves a backlog in turn asks again at once, and that
            # lateness divided by no time at all would read as a large demand
            if self.pace:
                edges = 0 if self.strict else self._at_edges(ended - waited, ended)
                waited = max(0, waited - interval - edges - WAKE_NS)
            self.extra += last_cost * waited / work
        if len(self._calls) < CALLERS:
            self._calls[caller] = (now, cost)

    def _at_edges(self, began: int, ended: int) -> int:
        """How much of ``[began, ended)`` lies within `margin` of a window's edge
        (in time from ``edge`` before a window's start on, the first ``2 * edge``
        of every window length)."""
        if ended <= began:
            return 0
        window, edge = self.window_ns, self._edge
        near = 2 * edge

        def before(t: int) -> int:
            return (t // window) * near + min(t % window, near)

        return before(ended + edge) - before(began + edge)

    def done(self, now: int, caller: object) -> None:
        """``caller``'s call returned, served or not."""
        if caller is None:
            return
        call = self._calls.pop(caller, None)
        if call is not None and len(self._returns) < CALLERS:
            began, cost = call
            # a wait that a report counted already counts from that report on
            self._returns[caller] = (now - max(began, self.period_start), now, cost)

    def report(self, now: int, least_ns: int, spent: int, line: int) -> tuple[int, int] | None:
        """``(wants, used)`` in millipermits per window since the last report, of
        the share that spent ``spent`` permits meanwhile on a line of ``line``
        (0: unknown); starts the next period. None for a period shorter than
        ``least_ns`` (a refresh soon after another, on a change of the total),
        too short to measure a rate: the last figures stand and the period goes on."""
        elapsed = max(1, now - self.period_start)
        if elapsed < least_ns and self.last is not None:
            return None
        per_window = MILLI * self.window_ns / elapsed
        used = round(spent * per_window)
        # a caller still waiting after half the period is held back, whatever its
        # rhythm: it counts as one that would come back at once (its wait's part
        # near an edge aside, as for one that came back)
        floor = self.window_ns // 1000
        edge = self._edge
        near_ns = self._at_edges(self.period_start, now) if edge else 0
        for asked_at, cost in self._calls.values():
            began = max(asked_at, self.period_start)
            held = now - began - (self._at_edges(began, now) if edge else 0)
            if held > 0 and held >= elapsed // 2:
                self.extra += cost * held / floor
        # paced, a window is two parts, within `margin` of its edges and between
        # them: each part's rate is measured over the period's time in it and
        # weighed by the part's share of a window; what waiting hid would have
        # been asked between them (see the module docstring)
        period = (self.asked - self.asked_near, self.extra, elapsed - near_ns,
                  self.asked_near, near_ns)  # fmt: skip
        mid_asked, hid, mid_ns, near_asked, near_ns = _joined(period, self.history)
        # a part the periods joined did not see is read from the latest that saw
        # it, while the other part's demand holds (its calls could come from the
        # last period's rate), else at the rate of the other part
        latest, before = self.latest_near, self._joined_mid
        holds = not before[1] or _alike(mid_asked, mid_ns, *before)
        if edge and not near_ns and latest is not None and holds:
            near_asked, near_ns = latest[3], latest[4]
        rates = [(mid_asked, hid, mid_ns), (near_asked, 0.0, near_ns)]
        if not near_ns:
            rates[1] = rates[0]
        if not mid_ns:
            rates[0] = (near_asked, hid, near_ns)
        self.history.append(period)
        self._joined_mid = (mid_asked, mid_ns)
        if period[4]:
            self.latest_near = period
        weights = (self.window_ns - 2 * edge, 2 * edge)
        calls = extra = per_call = 0.0
        for weight, (asked, hidden_calls, span) in zip(weights, rates, strict=True):
            each = MILLI * weight / span
            calls += asked * each
            extra += hidden_calls * each
            per_call = max(per_call, each)
        wants = round(calls)
        hidden = round(extra)
        if hidden:  # what waiting hid: nobody can spend more than the total
            wants += min(hidden, max(0, line - wants)) if line else hidden
        last = self.last
        if last is not None and abs(wants - last[0]) <= max(per_call, last[0] * STEADY):
            # a call more or less: the same demand, and the fleet's shares stay put
            wants = last[0]
        self.asked = self.asked_near = 0
        self.extra = 0.0
        self.period_start = now
        self._forget(now - 2 * elapsed)
        self.last = (wants, used)
        return wants, used

    def _forget(self, before: int) -> None:
        """Callers that have not come back since ``before`` count as new ones
        (a calls' task or thread may be another's by then)."""
        returns = self._returns
        for caller in [c for c, (_, ended, _) in returns.items() if ended < before]:
            del returns[caller]


def _joined(period: Period, history: deque[Period]) -> Period:
    """This period, joined by earlier ones (the latest first) until its calls
    number `SAMPLE`, while each part's calls could come from that one's rate."""
    mid, hidden, mid_ns, near, near_ns = period
    for earlier_mid, earlier_hidden, earlier_mid_ns, earlier_near, earlier_near_ns in reversed(
        history
    ):
        if mid + near >= SAMPLE:
            break
        if (earlier_mid_ns and not _alike(mid, mid_ns, earlier_mid, earlier_mid_ns)) or (
            earlier_near_ns and not _alike(near, near_ns, earlier_near, earlier_near_ns)
        ):
            break
        mid += earlier_mid
        hidden += earlier_hidden
        mid_ns += earlier_mid_ns
        near += earlier_near
        near_ns += earlier_near_ns
    return mid, hidden, mid_ns, near, near_ns


def _alike(count: int, span: int, earlier: int, earlier_span: int) -> bool:
    """Whether ``count`` calls in ``span`` could come from the rate of ``earlier``
    calls in ``earlier_span``: within three standard deviations (Poisson)."""
    expected = earlier * span / earlier_span
    return abs(count - expected) <= 3 * math.sqrt(max(expected, count)) + 2
