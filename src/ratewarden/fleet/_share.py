"""One member's share of a fleet quota, spent locally: no I/O, no locks, no clock.

The coordinator grants a member ``grant`` millipermits per window lying in a
few pieces of a line ``[0, total)``, each ``(start, start + length]``: no two
members' pieces overlap, and the coordinator never moves a member's pieces but
when that member refreshes (see `alloc.place`). Windows align to the epoch, so
every member agrees on their edges. In window ``w`` the permits are the marks
``off(w) + 1000*k`` on that line, and a member may spend the marks that fall in
its own pieces; for each:

    floor((start + length - off) / 1000) - floor((start - off) / 1000)

The marks number at most the total, and a member's view of its own pieces is
all it needs: the pieces the members spend never overlap, whatever each of them
has or has not heard of the others, so no window holds more than the total.
``off(w)`` moves by 0.618 of a permit each window (the golden ratio's
low-discrepancy walk), so the fractional remainders rotate among the members
window by window, deterministically: 10 permits a second over 96 members gives
each member a permit in about one window of every 9.6.

A grant that only gives up some of its pieces' space applies at once; one that
takes new space applies from the next window edge, so that the space another
member gave up (at its own refresh, before this one) is not spent twice in a
window the two share; unless nobody gave up any space for two windows (the
coordinator says when it last happened), as when a member joins a resource with
room to spare (a larger grant applied in the middle of a window then raises that
window's permits, spaced from then).

``pace``: the window's permits are spread evenly across it (GCRA), not spent at
its start, and none within `margin` (120 ms) of either edge of the member's
window: each window's permits are spent inside it, so that a member whose clock
is within 100 ms of the provider's (and whose requests take at most 20 ms to
reach it) has every permit of its window ``w`` counted in the provider's window
``w``, however its count moves from window to window as the marks rotate.

What the member reports back, and how it is measured: `_demand.Demand`.
"""

from __future__ import annotations

from ._demand import Demand
from .alloc import Piece, common, scaled, within

__all__ = ["Share"]

MILLI = 1000
STEP = 618  # how far the marks move each window, in millipermits: 1000 / golden ratio
SKEW_NS = 100_000_000  # the offset from the provider's clock that pacing absorbs
DELIVERY_NS = 20_000_000  # and the time a request takes from its permit to the provider


def margin(window_ns: int) -> int:
    """Paced, how far from either edge of its window a member spends nothing:
    `SKEW_NS` and `DELIVERY_NS`, or an eighth of a shorter window."""
    return min(SKEW_NS + DELIVERY_NS, window_ns // 8)


class Share:
    """The local state of one member's grant (see the module docstring).

    Times are integer nanoseconds of the member's clock (epoch). `take` is the
    hot path: a window index, one comparison, an increment.
    """

    __slots__ = (
        "_count",
        "_edge",
        "_first",
        "_interval",
        "_last",
        "_late",
        "_pending",
        "_stop",
        "_used",
        "_w",
        "demand",
        "grant",
        "held",
        "line",
        "pace",
        "phase",
        "pieces",
        "spent",
        "strict",
        "tat",
        "window_ns",
    )

    def __init__(
        self,
        window_ns: int,
        *,
        pace: bool = False,
        now: int = 0,
        strict: bool = False,
        phase: float = 0.0,
    ) -> None:
        if window_ns <= 0:
            raise ValueError("window must be > 0")
        self.window_ns = window_ns
        # strict: no stretch of one window, wherever it starts, holds more than
        # the grant's whole permits: its permits at least window / grant apart,
        # lateness not made up, a larger grant from when the coordinator says
        self.strict = strict
        self.pace = pace or strict
        # paced, not strict: where in its first spacing a window's first permit
        # falls (0-1), so that members' schedules do not all begin at one moment
        self.phase = phase
        # paced, not strict: how far from either edge of a window nothing is
        # spent; the current window's first moment and the one from which no
        # permit is spent (`_space` works them out for each window)
        self._edge = margin(window_ns) if self.pace and not strict else 0
        self._first = self._stop = 0
        self._late = window_ns  # how late a caller may be and keep the schedule
        self.grant = self.held = 0
        self.pieces: tuple[Piece, ...] = ()
        self.line = 0  # the effective total the pieces are laid out on (0: unknown)
        # grant, held, pieces, from which window on, and the line they lie on
        self._pending: tuple[int, int, tuple[Piece, ...], int, int] | None = None
        self._w = -1
        self._count = 0
        self._used = 0
        self._interval = window_ns
        self.tat = 0
        self._last = (0, 0)  # strict: the last permit's due time and cost
        self.spent = 0  # permits spent since the last report
        # what the callers ask, and would ask unhindered: measured for the reports
        self.demand = Demand(window_ns, self._edge, pace=self.pace, strict=strict, now=now)

    # -- the coordinator's word --------------------------------------------------

    def apply(
        self,
        grant: int,
        held: int,
        pieces: tuple[Piece, ...],
        now: int,
        *,
        settled: bool = False,
        line: int = 0,
        not_before: int = 0,
    ) -> None:
        """A grant from the coordinator (millipermits per window) and where it
        lies, on a line of ``line`` (the effective total the coordinator laid it
        out on; 0: unknown). ``settled``: no member gave up space for two windows,
        so new space is nobody else's to spend in this one and applies at once too."""
        if grant < 0 or held < grant or sum(length for _, length in pieces) != grant:
            raise ValueError(f"incoherent grant {grant}/{held} in {pieces}")
        w = now // self.window_ns
        if not settled and not within(pieces, self.pieces):
            # until then it spends only what it holds of the new pieces: a grant
            # that replaces a pending one may keep less of what it spends now,
            # and the coordinator counts only the new pieces as its
            kept = tuple(common(self.pieces, pieces))
            if kept != self.pieces:
                self.grant = sum(length for _, length in kept)
                self.pieces = kept
                if self._w == w:
                    self._count = min(self._count, self.permits(w))
                    self._space()
            start = max(w + 1, -(-not_before // self.window_ns))  # ``not_before``: strict's
            pending = self._pending
            if pending is not None and within(pieces, pending[2]):
                # space it was given before may be taken up as said then: a later
                # change elsewhere must not put off a grant again and again
                start = min(start, max(w + 1, pending[3]))
            self._pending = (grant, held, pieces, start, line)
            return
        self._pending = None
        self.grant, self.held, self.pieces, self.line = grant, held, pieces, line
        if self._w == w:
            if self.pace and not self.strict:
                # more space too: the marks of the new pieces, at their spacing
                # from now on, so the rest of the window sees the new rate
                self._count = self.permits(w)
            else:  # less space: this window may spend no more than it allows
                self._count = min(self._count, self.permits(w))
            self._space()

    def scale(self, new_total: int, old_total: int) -> None:
        """The total was cut from ``old_total`` to ``new_total``: every member's
        pieces shrink in proportion, at once (the coordinator scales its records
        in the same step). Pieces laid on another line than ``old_total`` (the
        cut applied already, heard first from a refresh or from the channel) are
        left as they are: a cut is applied once."""
        if old_total <= 0 or new_total >= old_total:
            return
        pending = self._pending
        if pending is not None and pending[4] in (0, old_total):
            pieces = tuple(scaled(pending[2], new_total, old_total))
            self._pending = (
                sum(length for _, length in pieces),
                pending[1] * new_total // old_total,
                pieces,
                pending[3],
                new_total,
            )
        if self.line not in (0, old_total):
            return
        self.line = new_total
        self.pieces = tuple(scaled(self.pieces, new_total, old_total))
        self.grant = sum(length for _, length in self.pieces)
        self.held = self.held * new_total // old_total
        if self._w >= 0:
            self._count = min(self._count, self.permits(self._w))
            self._space()

    def permits(self, w: int) -> int:
        """Whole permits this member may spend in window ``w``."""
        off = (w * STEP) % MILLI
        count = 0
        for start, length in self.pieces:
            count += (start - off + length) // MILLI - (start - off) // MILLI
        return count

    @property
    def position(self) -> tuple[Piece, ...]:
        """Where the member's grant lies, as the coordinator last said."""
        return self.pieces if self._pending is None else self._pending[2]

    @property
    def pending(self) -> int | None:
        """A larger grant that applies from the next window edge, if any."""
        return None if self._pending is None else self._pending[0]

    # -- spending ---------------------------------------------------------------

    def _roll(self, w: int) -> None:
        pending = self._pending
        if pending is not None and w >= pending[3]:
            self.grant, self.held, self.pieces, self.line = (
                pending[0],
                pending[1],
                pending[2],
                pending[4],
            )
            self._pending = None
        self._w = w
        self._used = 0
        self._count = self.permits(w)
        if self.pace and not self.strict:
            # a window's schedule starts anew: the margins keep its permits
            # apart from the last window's, and a spacing carried over from
            # another count would push its last permits past its end
            self.tat = 0
        self._space()

    def _space(self) -> None:
        """The spacing of paced permits: the window over its permits; strict,
        over the grant's whole permits, rounded up, and counted from the last
        permit spent (a smaller grant spaces the next one further at once)."""
        window = self.window_ns
        start = self._w * window
        self._stop = start + window - self._edge
        if not self.strict:
            count = self._count
            window -= 2 * self._edge  # paced, inside the window, clear of its edges
            self._interval = window // count if count else window
            self._first = start + self._edge + round(self.phase * self._interval)
            self._late = max(self._interval, self._edge // 2)
            return
        whole = self.grant // MILLI
        self._interval = -(-window // whole) if whole else window
        due, cost = self._last
        if cost:
            self.tat = due + self._interval * cost

    def _tat(self, now: int) -> int:
        """When the next paced permit of the current window may be spent. Not
        strict, a member spends nothing within `margin` of either edge of its
        window: each window's permits are spent inside it whatever the clock's
        offset from the provider's, up to the margin, and the provider's window
        gets no permit of a neighbour's, however the members' counts move from
        window to window (their pieces' marks rotate; see the module docstring).
        What it compares with is worked out once a window (`_space`)."""
        tat = self.tat
        if self.strict:
            return tat
        if now >= self._stop:
            return self._stop + 2 * self._edge  # the next window's first moment
        return tat if tat > self._first else self._first

    def end(self, at: int) -> int:
        """From when the permits of the window that holds ``at`` are no longer
        spent: a caller that reserved one and wakes later gives it up (see
        `forfeit`), for it would reach the provider in its next window."""
        return (at // self.window_ns + 1) * self.window_ns - self._edge

    def forfeit(self, cost: int) -> None:
        """A reserved permit woken too late is not spent (it stays used: its
        window's count is not raised again)."""
        self.spent -= cost

    def take(self, now: int, cost: int = 1) -> int:
        """Spend ``cost`` permits at ``now``: 0 when granted, else the nanoseconds
        to wait before it is worth trying again."""
        window = self.window_ns
        w = now // window
        if w != self._w:
            self._roll(w)
        if self._used + cost > self._count:
            return (w + 1) * window - now
        if self.pace:
            tat = self.tat
            if not self.strict:  # `_tat`, written out: this is the hot path
                if now >= self._stop:
                    return self._stop + 2 * self._edge - now
                if tat < self._first:  # noqa: PLR1730 - cheaper than a call to max
                    tat = self._first
            if now < tat:
                return tat - now
            # a caller that wakes late (by less than an interval, or half the
            # margin: a busy machine's threads wake that late) keeps the
            # schedule: the next slot stays where it was, so lateness costs no
            # permit before the window's last moment; after an idle spell the
            # schedule starts again from now (strict: always from now, so no two
            # permits come closer)
            interval = self._interval
            if self.strict:
                self._last = (now, cost)
                self.tat = now + interval * cost
            else:
                self.tat = (tat if tat >= now - self._late else now) + interval * cost
        self._used += cost
        self.spent += cost
        return 0

    def reserve(self, now: int, cost: int, patience: float) -> tuple[bool, int]:
        """For a caller that may wait up to ``patience`` ns: ``(True, delay)``
        when it holds the permit that falls due ``delay`` ns from ``now`` (0: at
        once), else ``(False, wait)``, the ns before it is worth asking again
        (the next window edge, or a due time past ``patience``).

        Paced, a waiting caller takes the next slot of the schedule now and
        sleeps until it is due, rather than sleeping and racing for it: a caller
        that wakes late spends its permit late instead of losing it, and many
        waiters do not all wake for one permit. Slots are reserved in the
        current window only (the next one's permits are not known yet), and a
        reserved permit counts as spent: a smaller grant that arrives meanwhile
        does not take it back, and a caller that stops waiting loses it."""
        window = self.window_ns
        w = now // window
        if w != self._w:
            self._roll(w)
        if self._used + cost > self._count:
            return False, (w + 1) * window - now
        if self.pace:
            tat = self._tat(now)
            if now < tat:
                if tat >= self._stop or tat - now > patience:
                    return False, tat - now
                self._last = (tat, cost)
                self.tat = tat + self._interval * cost
                self._used += cost
                self.spent += cost
                return True, tat - now
        wait = self.take(now, cost)
        return (True, 0) if not wait else (False, wait)

    def window_state(self, now: int) -> tuple[int, int]:
        """Permits of the current window, and how many are spent."""
        w = now // self.window_ns
        if w != self._w:
            self._roll(w)
        return self._count, self._used

    # -- what the callers ask, and what the member reports -----------------------

    def ask(self, now: int, cost: int = 1, caller: object = None) -> None:
        """A call for ``cost`` permits begins (counted once, whatever comes of
        it); ``caller``: who makes it (a thread, a task), to see it come back."""
        self.demand.ask(now, cost, caller, self._interval)

    def done(self, now: int, caller: object = None) -> None:
        """``caller``'s call returned, served or not."""
        self.demand.done(now, caller)

    def report(self, now: int, least_ns: int = 0) -> tuple[int, int, int]:
        """``(wants, has, used)`` in millipermits per window since the last report;
        starts the next period. A period shorter than ``least_ns`` (a refresh
        soon after another, on a change of the total) is too short to measure a
        rate: the last figures are sent again and the period goes on."""
        has = self.grant if self._pending is None else self._pending[0]
        figures = self.demand.report(now, least_ns, self.spent, self.line)
        if figures is None:
            wants, used = self.demand.last or (0, 0)
            return wants, has, used
        self.spent = 0
        return figures[0], has, figures[1]
