"""What a member of a fleet quota decides, without doing any I/O.

The sync and asyncio quotas (`FleetQuota`, `AsyncFleetQuota`) only send what this
builds, sleep, and hand back what came: a refresh's reply, a failure, a message on
the resource's channel. The cases:

- a reply: the grant applies (a smaller one at once, a larger one from the next
  window edge) and the lease runs from the moment the refresh was *sent*, so the
  member's idea of its lease ends no later than the coordinator's;
- a failure: logged at once, then once a minute while it lasts, and again when
  the coordinator answers. The member keeps its grant until its lease ends, then
  falls back to its safe share (what the coordinator last said: an equal part of
  the membership or the resource's number, within what the other members' safe
  shares leave) in two steps. First, for one more lease, the safe share or
  what it holds, whichever is smaller, at once and inside its own pieces: the
  members' leases end at different moments, and one that grew to the safe share
  before another shrank to it could overrun the total. Then, from the next window
  edge, the safe share: by then every member that lost the coordinator with it
  has shrunk;
- the resource is gone from Redis (restarted empty): the next refresh carries
  the configuration the member last knew, and the coordinator rebuilds from it,
  granting nobody more than it says it holds for two refresh intervals;
- the resource never reached Redis (the member started before its Redis
  answered): every refresh until the first reply carries the ``config`` given,
  and the coordinator creates the resource from it, as ``quota set`` would;
- a message: the total was cut; the grant shrinks in proportion at once, and a
  refresh follows.

What a refresh reports as wanted is measured (`_share.Share.report`), unless the
application says it: ``demand`` (a figure it sets) or ``wants`` (a function
asked at each refresh; None from it: the measured figure), in permits a window.
An application that knows its backlog (a queue consumer's lag) knows its demand
better than any measurement of its calls.
"""

from __future__ import annotations

import logging
import math
import os
import random
import socket
import time
import uuid
import zlib
from collections.abc import Callable
from typing import Any

from ..primitives import Clock, ConfigurationError
from ._share import Share
from .alloc import MILLI
from .alloc import place as alloc_place
from .config import QuotaConfig, check_name
from .coordinator import Reply, Report

__all__ = ["Member", "default_member_id"]

log = logging.getLogger("ratewarden.fleet")


def default_member_id() -> str:
    """host:pid:random, unique across restarts of a process."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Member:
    """One member's view of its resource (see the module docstring)."""

    def __init__(
        self,
        name: str,
        clock: Clock,
        *,
        member_id: str | None = None,
        pace: bool = False,
        config: QuotaConfig | None = None,
        wants: Callable[[], float | None] | None = None,
        replace_config: bool = False,
    ) -> None:
        self.name = check_name(name)
        self.replace_config = replace_config  # its config wins over the stored one
        if wants is not None and not callable(wants):
            raise ConfigurationError(f"wants must be a function or None, got {wants!r}")
        self.wants = wants
        self.demand: float | None = None  # permits a window the application says it wants
        member: object = default_member_id() if member_id is None else member_id
        if not isinstance(member, str) or not 0 < len(member) <= 200:
            raise ConfigurationError(
                f"member_id must be a string of 1-200 characters, got {member!r}"
            )
        self.id = member
        self.clock = clock
        self.pace = pace
        self.config = config  # what to create the resource with, if it does not exist
        self.known: dict[str, str] | None = None  # the coordinator's fields, last seen
        window = config.window_ns if config is not None else 1_000_000_000
        strict = config is not None and config.sliding
        # where in its spacing its paced permits fall: its own, and the same each run
        self.phase = zlib.crc32(member.encode()) / 2**32
        self.share = Share(window, pace=pace, now=clock.time_ns(), strict=strict, phase=self.phase)
        self.lease_until = 0  # ns of the member's clock; 0: no grant yet
        self.members = 0
        self.safe: int | None = None  # the coordinator's word on its safe share
        self.soon = False  # the next refresh comes after a 32nd of an interval
        self._soon = 0  # such refreshes in a row
        self.throttled = 0  # provider refusals since the last report
        self.fallen_back = False
        self.safe_from = 0  # ns of the member's clock: from when the whole safe share applies
        self.refreshes = 0
        self.measured = 0  # reports that ended a period long enough to measure demand
        self.failures = 0
        self.unreachable_since: float | None = None  # wall-clock seconds; None: answering
        self.last_error: str = ""
        self._said_at = 0  # ns of the member's clock: the last "still unreachable" line
        self._told_config = False

    # -- refresh ----------------------------------------------------------------

    def report(self) -> Report:
        """What the next refresh sends (see `Report`); the configuration in it,
        to create the resource with if the coordinator does not have it, is the
        one last seen stored (restored with a rebuild), else the one given
        (created as `set` creates it), so that a member that started before its
        Redis answered joins when it answers."""
        least = 0
        restore = None if self.config is None else self.config.fields()
        if self.known is not None:
            least = int(self.known.get("refresh_ms", "1000")) * 500_000  # half, in ns
            restore = {k: v for k, v in self.known.items() if k not in _TRANSIENT}
        now = self.clock.time_ns()
        if self.known is not None and now - self.share.demand.period_start >= least:
            self.measured += 1  # a period long enough to measure a rate ends
        wants, has, used = self.share.report(now, least)
        told = self._told()
        if told is not None:
            wants = told
        elif not self.measured and self.known is not None:
            # just joined, demand not measured over a whole period yet: ask for
            # an equal share rather than nothing, so that the first callers need
            # not wait a refresh (the first period began before the first reply)
            equal = int(self.known.get("eff_m", "0")) // max(1, self.members)
            wants = max(wants, equal)
        throttled, self.throttled = self.throttled, 0
        return Report(wants, has, used, throttled, self.share.position, restore, self.pace)

    def _told(self) -> int | None:
        """The demand the application states (millipermits a window), if it does."""
        demand = self.demand
        if self.wants is not None:
            try:
                demand = self.wants()
            except Exception:  # a failing hook must not stop the refreshes
                log.exception("quota %r: the wants function failed", self.name)
                demand = None
            if demand is not None and not _permits(demand):
                log.warning("quota %r: wants gave %r, not a number >= 0", self.name, demand)
                demand = None
        if demand is None:
            return None
        told = round(min(demand, _MOST) * MILLI)
        total = int(self.known.get("eff_m", "0")) if self.known is not None else 0
        return min(told, total) if total else told  # nobody can spend more than the total

    def state_demand(self, permits: float | None) -> None:
        """The demand to report from now on, permits a window (None: measure it)."""
        if permits is not None and not _permits(permits):
            raise ConfigurationError(f"demand must be a number >= 0 or None, got {permits!r}")
        self.demand = None if permits is None else float(permits)

    def on_reply(self, reply: Reply, sent_at: int) -> None:
        now = self.clock.time_ns()
        fields = reply.fields
        config = QuotaConfig.from_fields(fields)
        if self.unreachable_since is not None:
            log.warning(
                "quota %r: the coordinator answers again, after %.3g s and %d failed refreshes",
                self.name,
                max(0.0, self.clock.time_ns() / 1e9 - self.unreachable_since),
                self.failures,
            )
            self.unreachable_since = None
        if not self.refreshes:  # joining: later changes are the operator's (`quota set`)
            self._check_config(config)
        if config.window_ns != self.share.window_ns or config.sliding != self.share.strict:
            self.share = Share(
                config.window_ns, pace=self.pace, now=now, strict=config.sliding, phase=self.phase
            )
        elif reply.effective_total < self.share.line:  # a cut it did not hear of yet
            self.share.scale(reply.effective_total, self.share.line)
        self.known = fields
        self.members = reply.members
        self.safe = reply.safe
        # granted less than half its due while others hold the rest: they were
        # asked to give it back now, so it asks again soon (a few times at most)
        behind = reply.target is not None and reply.grant * 2 < reply.target
        self.soon = behind and self._soon < _SOON
        self._soon = self._soon + 1 if self.soon else 0
        freed = int(fields.get("freed_ms", "0"))
        two_windows = 2 * config.window_ns // 1_000_000
        settled = reply.now_ms - freed >= two_windows
        not_before = 0
        if config.sliding:
            # space given up at freed_ms (the coordinator's clock) is taken up a
            # whole window later, whatever the clocks, so that no stretch of one
            # window holds both the old holder's permits and the new one's: the
            # round trip bounds how late the old holder heard of its cut
            rtt = max(0, now - sent_at)
            given_up = now + (freed - reply.now_ms) * 1_000_000
            not_before = given_up + config.window_ns + 2 * rtt + SLIDING_MARGIN_NS
            settled = not_before <= now
        self.share.apply(
            reply.grant,
            reply.held,
            reply.pieces,
            now,
            settled=settled,
            line=reply.effective_total,
            not_before=not_before,
        )
        self.lease_until = sent_at + round(config.lease * 1e9)
        self.fallen_back = False
        self.safe_from = 0
        self.refreshes += 1

    def _check_config(self, stored: QuotaConfig) -> None:
        """Say once when the configuration this member was given is not the
        stored one: the stored one applies (``ratewarden quota set`` changes it)."""
        if self._told_config or not self.config_differs(stored) or self.replace_config:
            return
        mine = self.config
        assert mine is not None
        self._told_config = True
        log.warning(
            "quota %r: config= given here (%s) differs from the one stored in Redis (%s);"
            " the stored one applies. Change it with `ratewarden quota set`, or pass"
            " replace_config=True to make this member's win",
            self.name,
            mine.describe(),
            stored.describe(),
        )

    def why_nothing(self) -> str:
        """Why this member holds no permits, for a caller that gave up."""
        if self.unreachable_since is not None:
            since = time.strftime("%H:%M:%S", time.gmtime(self.unreachable_since))
            why = (
                f"this member holds no permits: Redis (the coordinator) has been unreachable"
                f" since {since} UTC, {self.failures} failed refreshes ({self.last_error})"
            )
            if self.known is None:
                why += "; it never joined, and an equal safe share needs the membership"
            return why
        if self.known is None:
            return "this member holds no permits: it has not joined yet (start() it first)"
        return (
            "the coordinator granted this member nothing: the other members hold the"
            " total, or its demand is not measured yet"
        )

    def config_differs(self, stored: QuotaConfig | None = None) -> bool:
        """True when a ``config`` was given and the stored one is another."""
        if stored is None:
            if self.known is None:
                return False
            stored = QuotaConfig.from_fields(self.known)
        return self.config is not None and self.config.fields() != stored.fields()

    def _unreachable(self, error: Exception, now: int) -> None:
        """Log a lost coordinator once, then once a minute while it lasts."""
        self.last_error = str(error)
        if self.unreachable_since is None:
            self.unreachable_since = self.clock.time_ns() / 1e9
            self._said_at = now
            if self.known is None and self.share.grant:
                what = f"spending the safe share, {self.share.grant / MILLI:.6g} permits a window"
            elif self.known is None:
                what = "nothing is admitted until it answers (safe share: equal, or none given)"
            else:
                what = "keeping its grant until its lease ends, then the safe share"
            log.warning("quota %r: cannot reach the coordinator (%s); %s", self.name, error, what)
        elif now - self._said_at >= 60 * 10**9:
            self._said_at = now
            log.warning(
                "quota %r: still cannot reach the coordinator, for %.0f s and %d failed"
                " refreshes (%s); granted %.6g permits a window",
                self.name,
                self.clock.time_ns() / 1e9 - self.unreachable_since,
                self.failures,
                error,
                self.share.grant / MILLI,
            )

    def _before_joining(self, now: int) -> None:
        """No reply yet: the failure policy applies from the start. A number as
        the safe share (of the ``config`` given) is spent at once; an equal part
        needs the membership, so nothing is, until the coordinator answers."""
        config = self.config
        if self.fallen_back or config is None or config.safe == "equal":
            return
        total = config.rate.limit * MILLI
        grant = min(int(config.safe) * MILLI, total)
        if grant:
            self.share.apply(grant, grant, ((0, grant),), now, settled=True, line=total)
            self.fallen_back = True

    def on_failure(self, error: Exception) -> None:
        """A refresh failed: keep the grant while the lease lasts, then the safe
        share in two steps (see the module docstring)."""
        self.failures += 1
        now = self.clock.time_ns()
        if self.known is None:
            self._before_joining(now)
        self._unreachable(error, now)
        if self.known is None or now < self.lease_until:
            return
        if self.fallen_back and (not self.safe_from or now < self.safe_from):
            return  # the whole safe share applies already, or not yet
        config = QuotaConfig.from_fields(self.known)
        total = int(self.known.get("eff_m", "0"))
        share = self.share
        if self.safe is not None:  # the coordinator's: the members' add up to the total at most
            grant = min(self.safe, total)
        elif config.safe == "equal":
            grant = total // max(1, self.members)
        else:
            grant = min(int(config.safe) * MILLI, total)
        if not self.fallen_back:
            kept = min(grant, share.grant)  # inside what it spends now: less, at once
            log.warning(
                "quota %r: no word from the coordinator for a lease (%s); falling back to"
                " the safe share (%s: %.6g permits a window), after a lease at %.6g",
                self.name,
                error,
                config.safe,
                grant / MILLI,
                kept / MILLI,
            )
            pieces = tuple(alloc_place(total, share.pieces, kept, ()))
            share.apply(kept, share.held, pieces, now, line=share.line)
            self.fallen_back = True
            self.safe_from = now + round(config.lease * 1e9)
            return
        # around its own pieces: where it spent, the others did not
        pieces = tuple(alloc_place(total, share.pieces, grant, ()))
        share.apply(grant, max(share.held, grant), pieces, now, line=total)
        self.safe_from = 0

    def on_message(self, data: Any) -> bool:
        """A message on the resource's channel; True if it asks for a refresh."""
        try:
            _version, new, old = (int(part) for part in _text(data).split())
        except ValueError:
            return False
        if new == old:  # a member behind asks the others to refresh: not itself
            return not self.soon
        self.share.scale(new, old)
        if self.safe is not None and old > 0:
            self.safe = self.safe * new // old
        if self.known is not None:
            self.known = {**self.known, "eff_m": str(new)}
        return True

    def next_delay(self, jitter: float | None = None) -> float:
        """Seconds to the next refresh: the resource's interval, jittered by 10%
        (``jitter``, 0.9-1.1, else random) so that a fleet started together does
        not refresh in step; a 32nd of it after a reply that left it behind."""
        refresh = 1.0 if self.config is None else self.config.refresh
        if self.known is not None:
            refresh = int(self.known.get("refresh_ms", "1000")) / 1000
        if self.soon:
            refresh /= 32
        return refresh * (random.uniform(0.9, 1.1) if jitter is None else jitter)

    @property
    def grant(self) -> float:
        """Permits a window the coordinator granted this member last (a larger
        grant is spent from the next window edge on)."""
        pending = self.share.pending
        return (self.share.grant if pending is None else pending) / MILLI


# the coordinator's own bookkeeping: not restored after Redis lost the resource
_TRANSIENT = frozenset(
    {"seq", "rebuild_ms", "cut_ms", "raise_ms", "freed_ms", "hard_ms", "nudge_ms"}
)


SLIDING_MARGIN_NS = 20_000_000  # for a member's reply read late, beyond its round trip

_SOON = 3  # quick refreshes in a row, at most

_MOST = 2**40  # permits a window: far beyond any total, and exact in Lua's doubles


def _permits(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def _text(data: Any) -> str:
    return data.decode() if isinstance(data, bytes) else str(data)
