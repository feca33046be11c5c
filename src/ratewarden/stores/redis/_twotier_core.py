"""The two-tier engines' shared part, no I/O: the limits, the clock, and the script
calls of the checks and syncs that need Redis (the engines of `_atwotier_io` and
`_twotier_io` run them, async and sync).

A check that needs Redis is written as a generator that yields the script calls
and is sent their replies, which each twin drives its own way (as the exact
store's multi-tier calls are).

Every `_sync.lua` call carries an id (a key of its own in the slot of the call's
keys, kept `ID_TTL_AT_LEAST` or longer). A call whose reply is lost may have been
applied or not: its hits are kept as they were sent, and sent again with the same
id, which the script applies at most once (`Engine.lost`). Given back to the
entries and merged with newer hits instead, they would be counted twice whenever
the call had landed (a timeout with the call in flight).
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any

from ...algorithms import Algorithm, peek
from ...primitives import Clock, Decision, Rate, StoreError, StoreUnavailable
from ..base import BindOptions, Check, check_cost, pick
from ..failure import Breaker, LocalFallback, answer
from ._twotier import Entry, LocalLimit, Sent, TwoTierSettings
from .scripts import SYNC

__all__ = ["CHUNK", "EXACT_TIERS", "Engine", "Step", "hash_tag", "judge", "peeked"]

log = logging.getLogger("ratewarden.stores")

CHUNK = 512  # keys per sync script call: a call blocks Redis while it runs
_ONE = 1
# How long Redis keeps a call's id, at least, and in sync intervals: a call sent
# again later than that (Redis unreachable all the while after taking it) may count
# twice. The ids in Redis are about one a sync (and a cluster slot synced) for each
# process, times this.
ID_TTL_AT_LEAST = 10.0
ID_TTL_SYNCS = 20

# A script call for the shell to make, or the exact tiers of a request to check.
Call = tuple[str, int, list[Any]]
Step = Call | tuple[str, Sequence[Check]]
EXACT_TIERS = "exact"
# What one call carried, by entry; a sync's call with its id key and these, and
# whether it is one sent again.
Members = list[tuple[LocalLimit, Entry, Sent]]
Batch = tuple[Call, str, Members, bool]


class Engine:
    """What the twins share: the limits, the clock, planning; no I/O."""

    def __init__(
        self,
        settings: TwoTierSettings,
        breaker: Breaker,
        test_clock: Clock | None,
        keyslot: Callable[[str], int] | None,
        *,
        fallback: LocalFallback,
    ) -> None:
        self.settings, self.breaker, self.test_clock = settings, breaker, test_clock
        self.fallback = fallback
        self.keyslot = keyslot
        self.limits: list[LocalLimit] = []
        self.offset_us = 0  # the server's clock less ours, from the last sync
        self.timed = test_clock is not None  # the offset is known (a test clock has none)
        self.closed = False
        # the calls' ids: this engine's, random, then a count
        self.ids = itertools.count()
        self.id_prefix = os.urandom(8).hex()
        self.id_ttl_ms = round(max(ID_TTL_AT_LEAST, ID_TTL_SYNCS * settings.sync_interval) * 1000)
        self.slot_tags: dict[int, str] = {}
        # calls whose reply was lost, to send again as they were: their id keys and
        # what they carried (bounded by the entries: one with hits in them sends no
        # new ones until they are answered, `LocalLimit.send`)
        self.pending: list[tuple[str, Members]] = []

    def now_us(self) -> int:
        """The server's time as this process reckons it."""
        if self.test_clock is not None:
            return self.test_clock.time_ns() // 1000
        return time.time_ns() // 1000 + self.offset_us

    def now_arg(self) -> int | str:
        """The script's time argument: the test clock's, else Redis's own."""
        return "" if self.test_clock is None else self.test_clock.time_ns() // 1000

    def heard(self, server_us: int, sent_at: int, back_at: int) -> None:
        """The server's time from a reply: the clocks' offset, at the round trip's
        midpoint (wrong by at most half of it)."""
        if self.test_clock is None:
            self.offset_us = server_us - (sent_at + back_at) // 2000
        if not self.timed:
            self.timed = True
            for limit in self.limits:
                limit.timed = True

    def make(self, algorithm: Algorithm, rate: Rate, options: BindOptions) -> LocalLimit:
        limit = LocalLimit(algorithm, rate, options, self.settings)
        limit.timed = self.timed
        if options["on_failure"] == "local_fallback":
            limit.local = self.fallback.share(algorithm, rate, options)
        self.limits.append(limit)
        return limit

    def entry(self, limit: LocalLimit, key: str) -> Entry:
        """The key's entry; past a tenth over ``max_keys`` (keys arriving faster than
        the syncs evict, or a store that is down holding every entry's hits), one
        that is not kept: its checks go to Redis (`LocalLimit.decide`)."""
        entries = limit.entries
        entry = entries.get(key)
        if entry is None:
            entry = Entry(limit.prefix + key)
            if len(entries) <= self.settings.max_keys * 1.1:
                entries[key] = entry
        return entry

    def blocked(self, tiers: Sequence[tuple[LocalLimit, Entry, int, int]]) -> Decision | None:
        """The policies' answer while the breaker is open, else None."""
        if not self.breaker.failures or self.breaker.allow():
            return None
        wait = self.breaker.retry_after()
        error = StoreUnavailable(f"redis: circuit open, next probe in {wait:.3f}s")
        return answer([t[0] for t in tiers], _checks(tiers), wait, error)

    def failed(
        self, tiers: Sequence[tuple[LocalLimit, Entry, int, int]], error: StoreError
    ) -> Decision:
        self.breaker.failed()
        return answer([t[0] for t in tiers], _checks(tiers), self.breaker.retry_after(), error)

    # -- a request that needs Redis --------------------------------------------------

    def calls(self, checks: Sequence[Check], lock: Any) -> Generator[Step, Any, Decision]:
        """A request's checks (two-tier tiers, and any exact ones), written once for
        both twins: each yields a script call (or the exact tiers) and is sent its
        reply; a store error is thrown in.

        The two-tier tiers are judged here first, nothing counted: one that is
        denied on what is known denies the request. Those that need Redis go to it
        together, all or none counted (`_sync.lua`'s "all"), then the exact tiers;
        a denial there takes back what the two-tier ones counted. The rest are
        counted here last."""
        ours: list[tuple[LocalLimit, Entry, int, int]] = []
        exact: list[Check] = []
        with lock:
            for limit, key, cost in checks:
                check_cost(cost)
                if isinstance(limit, LocalLimit):
                    now = self.now_us() // limit.tick_us
                    ours.append((limit, self.entry(limit, key), now, cost))
                else:
                    exact.append((limit, key, cost))
        blocked = self.blocked(ours)
        if blocked is not None:
            return blocked
        decisions: list[Decision] = []
        asked: list[tuple[LocalLimit, Entry, int, int]] = []
        here: list[tuple[LocalLimit, Entry, int, int]] = []
        repeated = {id(t[1]) for t in ours if sum(u[1] is t[1] for u in ours) > 1}
        with lock:
            for limit, entry, now, cost in ours:
                # a key in several tiers: each judged alone would spend one allowance
                # twice; Redis sees them in turn
                judged = None if id(entry) in repeated else judge(limit, entry, now, cost)
                if judged is None:
                    asked.append((limit, entry, now, cost))
                elif not judged.allowed:
                    decisions.append(judged)
                else:
                    here.append((limit, entry, now, cost))
        if decisions:
            return pick(decisions)
        counted: list[tuple[LocalLimit, Entry, int, int]] = []
        for group in self.groups(asked):
            answers = yield from self.ask(group, lock, together=True)
            if any(not d.allowed for d in answers):
                self.refund(counted, lock)
                return pick(answers)
            counted += group
            decisions += answers
        if exact:
            decision: Decision = yield EXACT_TIERS, exact
            if not decision.allowed:
                self.refund(counted, lock)
                return decision
            decisions.append(decision)
        with lock:
            for limit, entry, now, cost in here:
                # as judged (a lease, or the allowance), or counted here if another
                # thread has spent what the judgement saw
                decided = limit.decide(entry, now, cost)
                if decided is None or not decided.allowed:
                    decided = limit.admit(entry, now, cost)
                decisions.append(decided)
        return pick(decisions)

    def one(
        self, limit: LocalLimit, entry: Entry, cost: int, lock: Any
    ) -> Generator[Step, Any, Decision]:
        """One tier's exact check (`LocalLimit.decide` could not answer)."""
        now = self.now_us() // limit.tick_us
        blocked = self.blocked([(limit, entry, now, cost)])
        if blocked is not None:
            return blocked
        answers = yield from self.ask([(limit, entry, now, cost)], lock, together=False)
        return answers[0]

    def fetch(self, limit: LocalLimit, entry: Entry, lock: Any) -> Generator[Step, Any, Decision]:
        """Asks for an entry's state, checking nothing (a peek at an unknown key)."""
        now = self.now_us() // limit.tick_us
        yield from self.ask([(limit, entry, now, 0)], lock, together=False)
        return peeked(limit, entry, now, 1)

    def ask(
        self, group: list[tuple[LocalLimit, Entry, int, int]], lock: Any, *, together: bool
    ) -> Generator[Step, Any, list[Decision]]:
        """One `_sync.lua` call for ``group`` (one cluster slot): their unsent hits
        and their exact checks."""
        parts: list[bytes] = []
        sent: list[Sent] = []
        with lock:
            for limit, entry, _, cost in group:
                lease = 0 if together or not cost else limit.lease(entry, cost)
                payload, what = limit.send(entry, cost, lease)
                parts.append(payload)
                sent.append(what)
        keys = [entry.key for _, entry, _, _ in group]
        key = self.id_key(keys[0])
        sent_at = time.time_ns()
        try:
            reply = yield self.sync_call(keys, key, parts, "all" if together else "one")
        except StoreError as exc:
            with lock:
                self.lost(key, [(t[0], t[1], what) for t, what in zip(group, sent, strict=True)])
            return [self.failed(group, exc)]
        if self.breaker.failures:
            self.breaker.succeeded()
        server_us = int(reply[0])
        self.heard(server_us, sent_at, time.time_ns())
        answers = []
        with lock:
            for i, ((limit, entry, _, _), what) in enumerate(zip(group, sent, strict=True)):
                answer = limit.applied(entry, what, reply[6 * i + 1 : 6 * i + 7], server_us)
                if answer is not None:  # None: a fetch, no check asked
                    answers.append(answer)
        return answers

    def id_key(self, key: str) -> str:
        """A new call id's key, in the hash slot of ``key`` (a call's first key): its
        hash tag, or the key itself as one. A key that cannot serve as a tag (a
        ``}`` outside one, or none at all) takes, on a cluster, a short tag found for
        its slot."""
        tag = hash_tag(key)
        if not tag or "}" in tag:
            tag = "" if self.keyslot is None else self.slot_tag(self.keyslot(key))
        return f"{{{tag}}}:ratewarden:call:{self.id_prefix}:{next(self.ids)}"

    def slot_tag(self, slot: int) -> str:
        """The first number whose text hashes to ``slot`` (some 16,000 tries, once a
        slot, for keys that cannot be their own tag)."""
        tag = self.slot_tags.get(slot)
        if tag is None:
            assert self.keyslot is not None
            keyslot = self.keyslot
            tag = self.slot_tags[slot] = next(
                t for t in map(str, itertools.count()) if keyslot(t) == slot
            )
        return tag

    def sync_call(self, keys: list[str], id_key: str, parts: list[bytes], mode: str) -> Call:
        """A `_sync.lua` call: the entries' keys, then the call's id key."""
        args = [*keys, id_key, self.now_arg(), b"".join(parts), mode, self.id_ttl_ms]
        return SYNC, len(keys) + 1, args

    def lost(self, id_key: str, members: Members) -> None:
        """A call's reply is lost (called with the lock held): its hits wait to be
        sent again, as they were, under the same id (`LocalLimit.lost`)."""
        again = []
        for limit, entry, sent in members:
            resend = limit.lost(entry, sent)
            if resend is not None:
                again.append((limit, entry, resend))
        if again:
            self.pending.append((id_key, again))

    def forget(self, entry: Entry) -> None:
        """A reset key: what it has pending is not sent again (called with the lock
        held)."""
        if entry.pending:
            entry.pending = 0
            kept = [(k, [m for m in ms if m[1] is not entry]) for k, ms in self.pending]
            self.pending = [(k, ms) for k, ms in kept if ms]

    def refund(self, counted: list[tuple[LocalLimit, Entry, int, int]], lock: Any) -> None:
        """Takes back what tiers counted in Redis for a request another tier denied:
        a negative delta, sent with the next sync."""
        with lock:
            for limit, entry, now, cost in counted:
                limit.count(entry, now, -cost)

    def groups(
        self, tiers: list[tuple[LocalLimit, Entry, int, int]]
    ) -> list[list[tuple[LocalLimit, Entry, int, int]]]:
        """``tiers`` by cluster slot (one group on a single server): a script's keys
        must share one. A key repeated goes in a group of its own."""
        if not tiers:
            return []
        out: dict[Any, list[tuple[LocalLimit, Entry, int, int]]] = {}
        for tier in tiers:
            slot = 0 if self.keyslot is None else self.keyslot(tier[1].key)
            group = out.setdefault(slot, [])
            if any(t[1] is tier[1] for t in group):
                group = out.setdefault((slot, len(out)), [])
            group.append(tier)
        return list(out.values())

    # -- the periodic sync -----------------------------------------------------------

    def batches(self, lock: Any, *, new: bool) -> list[Batch]:
        """The sync's script calls: those whose reply was lost, again (``new``
        False: a sync sends these first, so that their entries' newer hits go in
        the same sync once they are answered); or every other entry with unsent
        hits, at most `CHUNK` keys a call, one slot a call, handed over here."""
        if not new:
            with lock:
                again, self.pending = self.pending, []  # taken: no other sync sends them
            calls: list[Batch] = []
            for key, members in again:
                parts = [limit.payload(sent) for limit, _, sent in members]
                call = self.sync_call([m[1].key for m in members], key, parts, "one")
                calls.append((call, key, members, True))
            return calls
        groups: dict[int, list[tuple[LocalLimit, Entry, bytes, Sent]]] = {}
        with lock:
            for limit in self.limits:
                for entry in limit.entries.values():
                    if (entry.delta or entry.pdelta) and not entry.pending:
                        payload, sent = limit.send(entry, 0)
                        slot = 0 if self.keyslot is None else self.keyslot(entry.key)
                        groups.setdefault(slot, []).append((limit, entry, payload, sent))
        calls = []
        for grouped in groups.values():
            for first in range(0, len(grouped), CHUNK):
                chunk = grouped[first : first + CHUNK]
                keys = [m[1].key for m in chunk]
                key = self.id_key(keys[0])
                call = self.sync_call(keys, key, [m[2] for m in chunk], "one")
                calls.append((call, key, [(m[0], m[1], m[3]) for m in chunk], False))
        return calls

    def synced(self, batch: Batch, reply: Any, lock: Any, sent_at: int) -> None:
        """Takes in one sync call's reply, or, if it is an exception, keeps the hits
        to send again under the same id (`lost`): a failure of any kind loses none,
        and counts none twice."""
        _, key, chunk, again = batch
        if isinstance(reply, Exception) and not isinstance(reply, StoreError):
            log.error("two-tier sync call failed", exc_info=reply)
        with lock:
            if isinstance(reply, BaseException):
                if again:  # as it was, pending still
                    self.pending.append((key, chunk))
                else:
                    self.lost(key, chunk)
                return
            server_us = int(reply[0])
            for i, (limit, entry, sent) in enumerate(chunk):
                if again:
                    entry.pending -= 1
                limit.applied(entry, sent, reply[6 * i + 1 : 6 * i + 7], server_us)
        self.heard(server_us, sent_at, time.time_ns())

    def unsent(self) -> tuple[int, int]:
        """Hits not yet in Redis, and their keys."""
        units = keys = 0
        for limit in self.limits:
            for entry in limit.entries.values():
                left = abs(entry.delta) + abs(entry.pdelta) + abs(entry.sdelta)
                if left:
                    units, keys = units + left, keys + 1
        return units, keys

    def unsent_at_close(self) -> None:
        """Says so when a closing store could not send every hit (Redis down)."""
        units, keys = self.unsent()
        if units:
            log.warning("two-tier: %d hits of %d keys could not reach Redis at close", units, keys)

    def trim(self, lock: Any) -> None:
        """After a sync: every limit back under ``max_keys``."""
        with lock:
            for limit in self.limits:
                self.evict(limit)

    def evict(self, limit: LocalLimit) -> None:
        """Past ``max_keys``, drops the oldest entries that have nothing unsent,
        down to nine tenths of it (called with the lock held; the work is the
        entries dropped and the busy ones passed over, not the whole dict)."""
        entries = limit.entries
        settings = self.settings
        drop = len(entries) - settings.max_keys
        if drop <= 0:
            return
        drop += settings.max_keys // 10
        gone = []
        for key, entry in entries.items():  # oldest first: dicts keep insertion order
            # One with hits to send stays, and so does one known full: dropped, it
            # would pass hits on no knowledge when it comes back.
            full = entry.synced >= 0 and entry.left <= 0
            busy = entry.delta or entry.pdelta or entry.sdelta or entry.spdelta or entry.pending
            if not (busy or full):
                gone.append(key)
                if len(gone) >= drop:
                    break
        for key in gone:
            del entries[key]


def hash_tag(key: str) -> str:
    """What Redis Cluster hashes of ``key``: the text between its first ``{`` and the
    first ``}`` after it, if not empty, else the whole key."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def _checks(tiers: Sequence[tuple[LocalLimit, Entry, int, int]]) -> list[tuple[str, int]]:
    """The keys as the caller gave them, and the costs, for the failure policies."""
    return [(entry.key[len(limit.prefix) :], cost) for limit, entry, _, cost in tiers]


def judge(limit: LocalLimit, entry: Entry, now: int, cost: int) -> Decision | None:
    """`LocalLimit.decide` without counting: a denial, an allowed Decision to count
    later, or None when Redis must decide."""
    allowance, left, leased = entry.allowance, entry.left, entry.leased
    delta, pdelta, dwin, seen = entry.delta, entry.pdelta, entry.dwin, entry.seen
    decision = limit.decide(entry, now, cost)
    if decision is not None and decision.allowed:  # undo the count: the calls redo it
        entry.allowance, entry.left, entry.leased = allowance, left, leased
        entry.delta, entry.pdelta, entry.dwin, entry.seen = delta, pdelta, dwin, seen
    return decision


def peeked(limit: LocalLimit, entry: Entry, now: int, cost: int) -> Decision:
    """What a hit would be told on what is known here, counting nothing."""
    return peek(limit.step, limit.current(entry, now), now, cost, limit.params)
