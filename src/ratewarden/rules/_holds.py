"""The concurrency rules' holds, written once as flows (`ratewarden.primitives.drive`
and ``adrive`` run them for `RuleEngine` and `AsyncRuleEngine`).

A request that a concurrency rule applies to takes a slot of the rule's key: a
lease in the store's lease table (`ratewarden.stores.leases`), under the key
``rw:conc:{<rule>:<key>}`` that `ratewarden.ConcurrencyLimiter` named after the
rule reads too. Every slot one request holds shares one lease id, so one
**token** names them all: the id and the (rule, key) of each slot, which
`release` reads back. A token is opaque to its holder; it names slots, not the
rules in force, so a slot is released after a reload has removed its rule too.

A hold ends ``lease`` seconds after it was taken unless released first (its
holder is often another process, a client of the service, that may die), and
the next call on its key reclaims the slot. A holder whose request runs longer
than the rule's ``lease`` renews its token (`Holds.renewing`): each slot's lease
then ends ``lease`` seconds after the renewal, by the lease of its rule in force.

A full limit refuses the request (action ``reject``), or, for ``delay`` with
``wait``, the request waits up to ``max_wait`` for a slot, looking again at
growing intervals. Waiters are served in line, in every process sharing the
store: by the class ``priority_from`` gives them (higher first), then first
come (the store's tickets, `ratewarden.stores.leases`). A request that gets every
slot is then counted against the rates; a request refused anywhere gives back
the slots it took. A caller cancelled while a slot is on its way leaves that
slot to its lease.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import secrets
import threading
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from ..primitives import Clock, ConfigurationError, Decision
from ..stores.leases import BUSY, EXPIRED, OK, TICKET_US, Place
from ..stores.leases import Outcome as LeaseOutcome
from ._actions import Outcome
from ._rule import CompiledRule

if TYPE_CHECKING:
    from ._compile import RuleSet

__all__ = ["Admission", "BadToken", "HoldStats", "Holds", "LeaseGone"]

FIRST_POLL = 0.001  # a waiter's first look again (seconds), doubling up to POLL
POLL = 0.05
MAX_TOKEN = 16_384  # characters: a token longer than this was never handed out
MAX_HOLDS = 256  # slots one token names at most (one a concurrency rule that applies)


class BadToken(ValueError):
    """A token that no acquire handed out (not one's shape)."""


class LeaseGone(LookupError):
    """A release of slots the store does not hold: ``expired`` when the lease had
    ended (and its slot was reclaimed), else released already or never taken."""

    def __init__(self, message: str, *, expired: bool) -> None:
        super().__init__(message)
        self.expired = expired


@dataclass(frozen=True, slots=True)
class Admission:
    """What ``acquire`` says: the ``outcome`` (as ``check`` says it), and when it
    was allowed with concurrency rules applying, the ``token`` that releases
    their slots, the ``holds`` (rule name, key) and the shortest ``lease``
    (seconds until the first slot ends unless released)."""

    outcome: Outcome
    token: str | None = None
    holds: tuple[tuple[str, str], ...] = ()
    lease: float | None = None

    @property
    def allowed(self) -> bool:
        return self.outcome.allowed

    def __bool__(self) -> bool:
        return self.outcome.allowed


@dataclass
class HoldStats:
    """The concurrency rules' figures in this process, by rule name (for the
    metrics; never by key): ``in_flight`` holds handed out and neither released
    nor past their lease, ``waiting`` requests waiting for a slot now,
    ``reclaimed`` ended leases dropped by the store calls made here, ``refused``
    requests that got no slot."""

    in_flight: dict[str, int] = field(default_factory=dict)
    waiting: dict[str, int] = field(default_factory=dict)
    reclaimed: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)


def store_key(rule: str, key: str) -> str:
    return f"rw:conc:{{{rule}:{key}}}"  # the whole key is the hash tag


def token_of(lease_id: str, holds: tuple[tuple[str, str], ...]) -> str:
    names = base64.urlsafe_b64encode(msgspec.json.encode(holds)).decode()
    return f"{lease_id}.{names.rstrip('=')}"


_decode_holds = msgspec.json.Decoder(list[tuple[str, str]]).decode


def parse_token(token: object) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The lease id and the (rule, key) slots of a token; `BadToken` if it is
    none. Typed decoding: a token a client made up costs no more than its length."""
    if not isinstance(token, str) or not 0 < len(token) <= MAX_TOKEN:
        raise BadToken(f"a lease id is the string an acquire answered, got {token!r:.80}")
    lease_id, _, names = token.partition(".")
    try:
        holds = _decode_holds(base64.urlsafe_b64decode(names + "=" * (-len(names) % 4)))
    except (ValueError, binascii.Error, msgspec.DecodeError):
        holds = []
    if not lease_id or not 0 < len(holds) <= MAX_HOLDS:
        raise BadToken(f"lease id {token!r:.80} is not one an acquire answered")
    return lease_id, tuple(holds)


class Holds:
    """The holds of one engine: lease ids, the flows and the figures. ``clock``
    times the waits; the leases' own expiry is the store's."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.stats = HoldStats()
        self._lock = threading.Lock()  # a sync engine's threads share the figures
        # for in_flight: lease length -> (lease id, rule) -> when it ends on ``clock``
        self._ends: dict[float, dict[tuple[str, str], float]] = {}

    def _count(self, table: dict[str, int], rule: str, n: int = 1) -> None:
        with self._lock:
            table[rule] = table.get(rule, 0) + n

    def admitting(
        self,
        leases: Callable[[], Any],
        applying: list[tuple[CompiledRule, str, int]],
        check: Callable[[], Any],
        wait: bool,
        sleep: Callable[[float], Any],
    ) -> Generator[Callable[[], Any], Any, Admission]:
        """``acquire``: the slots of ``applying`` (the store's lease table from
        ``leases()``), then ``check`` (the rates); a refusal gives the slots back."""
        if not applying:
            return Admission((yield check))
        table = leases()
        lease_id, refused = yield from self.acquiring(table, applying, wait, sleep)
        if refused is not None:
            return Admission(refused)
        holds = tuple((rule.name, key) for rule, key, _ in applying)
        token = token_of(lease_id, holds)
        outcome: Outcome = yield check
        if not outcome.allowed:
            with contextlib.suppress(LeaseGone):  # a slot that ended meanwhile is back already
                yield from self.releasing(table, token)
            return Admission(outcome)
        return Admission(outcome, token, holds, min(rule.lease for rule, _, _ in applying))

    def acquiring(
        self,
        leases: Any,
        applying: list[tuple[CompiledRule, str, int]],
        wait: bool,
        sleep: Callable[[float], Any],
    ) -> Generator[Callable[[], Any], Any, tuple[str, Outcome | None]]:
        """Take a slot of each (rule, key) in ``applying``, all under one lease
        id: the id, and None, or the denied `Outcome` (every slot given back)."""
        if len(applying) > MAX_HOLDS:
            raise ConfigurationError(
                f"{len(applying)} concurrency rules apply to one request: at most {MAX_HOLDS}"
            )
        # unguessable: a token names its slots, so its id is what proves it is held
        lease_id = secrets.token_hex(12)
        taken: list[tuple[CompiledRule, str]] = []
        for rule, key, priority in applying:
            waits = wait and rule.action == "delay" and bool(rule.max_wait)
            ask = _Asking(
                leases.call, store_key(rule.name, key), lease_id, rule.concurrency or 0,
                round(rule.lease * 1_000_000), priority, TICKET_US if waits else 0,
            )  # fmt: skip
            answer: LeaseOutcome = yield ask("take", 0)
            self._reclaimed(rule.name, answer)
            if answer.status == BUSY and waits:
                answer = yield from self._waiting(rule, ask, answer, sleep)
            if answer.status != OK:
                self._count(self.stats.refused, rule.name)
                for held, held_key in taken:  # refused: the slots taken go back
                    where = store_key(held.name, held_key)
                    yield functools.partial(leases.call, "release", where, lease_id, 0, 0)
                return lease_id, _refusal(rule, answer)
            taken.append((rule, key))
        self._held(lease_id, taken)
        return lease_id, None

    def _waiting(
        self,
        rule: CompiledRule,
        ask: Callable[[str, int], Callable[[], Any]],
        answer: LeaseOutcome,
        sleep: Callable[[float], Any],
    ) -> Generator[Callable[[], Any], Any, LeaseOutcome]:
        """Ask again until a slot comes or ``max_wait`` ends, keeping the place in
        line the first refusal gave; a waiter that gives up leaves the line."""
        deadline = self.clock.time_ns() / 1e9 + (rule.max_wait or 0.0)
        pause = FIRST_POLL
        self._count(self.stats.waiting, rule.name)
        try:
            while answer.status == BUSY:
                place = answer.queued_at
                left = deadline - self.clock.time_ns() / 1e9
                if left <= 0:
                    yield ask("leave", place)
                    break
                yield functools.partial(sleep, min(left, pause, max(answer.wait_us / 1e6, pause)))
                pause = min(pause * 2, POLL)
                answer = yield ask("take", place)
                self._reclaimed(rule.name, answer)
        finally:
            self._count(self.stats.waiting, rule.name, -1)
        return answer

    def releasing(
        self, leases: Any, token: object
    ) -> Generator[Callable[[], Any], Any, tuple[tuple[str, str], ...]]:
        """Release every slot a token names; the slots. `BadToken` for what no
        acquire handed out; `LeaseGone` (after releasing what is held) when a
        slot was not held."""
        lease_id, holds = parse_token(token)
        with self._lock:
            self._forget(lease_id, (rule for rule, _ in holds))
        gone: tuple[str, str, int] | None = None
        for rule, key in holds:
            answer: LeaseOutcome = yield functools.partial(
                leases.call, "release", store_key(rule, key), lease_id, 0, 0
            )
            self._reclaimed(rule, answer)
            if answer.status != OK and gone is None:
                gone = (rule, key, answer.status)
        if gone is not None:
            raise _gone(lease_id, *gone)
        return holds

    def renewing(
        self, leases: Any, token: object, ruleset: RuleSet
    ) -> Generator[Callable[[], Any], Any, float]:
        """Push every slot a token names on by the ``lease`` of its rule in
        ``ruleset`` (the `RuleSet` in force); the seconds until the first of them
        ends. `BadToken` for what no acquire handed out; `LeaseGone` (after
        renewing what is held) when a slot is not held, or its rule is no longer
        in force (it keeps the lease it had)."""
        lease_id, holds = parse_token(token)
        gone: tuple[str, str, int | str] | None = None
        renewed: list[CompiledRule] = []
        for name, key in holds:
            rule = ruleset.by_name.get(name)
            if rule is None or rule.concurrency is None:
                gone = gone or (name, key, "its rule is no longer in force: it keeps its lease")
                continue
            answer: LeaseOutcome = yield functools.partial(
                leases.call, "renew", store_key(name, key), lease_id, rule.concurrency,
                round(rule.lease * 1_000_000),
            )  # fmt: skip
            self._reclaimed(name, answer)
            if answer.status == OK:
                renewed.append(rule)
            else:
                with self._lock:
                    self._forget(lease_id, (name,))
                gone = gone or (name, key, answer.status)
        self._pushed(lease_id, renewed)
        if gone is not None:
            raise _gone(lease_id, *gone)
        return min(rule.lease for rule in renewed)

    def _reclaimed(self, rule: str, answer: LeaseOutcome) -> None:
        if answer.reclaimed:
            self._count(self.stats.reclaimed, rule, answer.reclaimed)

    def _held(self, lease_id: str, taken: list[tuple[CompiledRule, str]]) -> None:
        now = self.clock.time_ns() / 1e9
        with self._lock:
            self._sweep(now)
            flying = self.stats.in_flight
            for rule, _ in taken:
                self._ends.setdefault(rule.lease, {})[lease_id, rule.name] = now + rule.lease
                flying[rule.name] = flying.get(rule.name, 0) + 1

    def _pushed(self, lease_id: str, renewed: list[CompiledRule]) -> None:
        """Renewed slots end later: each moves to the end of its lease length's
        table (where it is the last to end), if this process counts it."""
        now = self.clock.time_ns() / 1e9
        with self._lock:
            for rule in renewed:
                slot = (lease_id, rule.name)
                for ending in self._ends.values():
                    if ending.pop(slot, None) is not None:
                        self._ends.setdefault(rule.lease, {})[slot] = now + rule.lease
                        break

    def _forget(self, lease_id: str, rules: Iterable[str]) -> None:
        for rule in rules:
            for ending in self._ends.values():  # one table per lease length: a few
                if ending.pop((lease_id, rule), None) is not None:
                    self.stats.in_flight[rule] -= 1
                    break

    def _sweep(self, now: float) -> None:
        """Forget the slots past their lease. The slots of one lease length sit in
        their table in the order they end (dicts keep the order of insertion), so
        each table is read only up to its first slot still held."""
        flying = self.stats.in_flight
        for ending in self._ends.values():
            while ending:
                slot, ends = next(iter(ending.items()))
                if ends > now:
                    break
                del ending[slot]
                flying[slot[1]] -= 1

    def in_flight(self) -> dict[str, int]:
        """Holds per rule handed out here and neither released nor ended."""
        with self._lock:
            self._sweep(self.clock.time_ns() / 1e9)
            return dict(self.stats.in_flight)


@dataclass(frozen=True, slots=True)
class _Asking:
    """The calls of one slot's take (or a waiter's leave), for the flow to yield."""

    call: Callable[..., Any]
    where: str
    lease_id: str
    limit: int
    lease_us: int
    priority: int
    ticket_us: int

    def __call__(self, op: str, queued_at: int) -> Callable[[], Any]:
        place = Place(self.priority, queued_at, self.ticket_us)
        return functools.partial(
            self.call, op, self.where, self.lease_id, self.limit, self.lease_us, place=place
        )


def _gone(lease_id: str, rule: str, key: str, status: int | str) -> LeaseGone:
    """What a release or renew of a slot not held says: ``status`` the store's
    answer, or why the slot was not asked for."""
    where = f"lease {lease_id!r} of rule {rule!r} key {key!r}"
    if isinstance(status, str):
        return LeaseGone(f"{where} is not renewed: {status}", expired=False)
    expired = status == EXPIRED
    if expired:
        why = "its lease had ended, and its slot is reclaimed"
    else:
        why = "released already, or its lease ended and another call reclaimed its slot"
    return LeaseGone(f"{where} is not held: {why}", expired=expired)


def _refusal(rule: CompiledRule, answer: LeaseOutcome) -> Outcome:
    retry = max(answer.wait_us / 1e6, 0.0)
    limit = rule.concurrency or 0
    decision = Decision(False, limit, 0, retry, retry, rule.name)
    return Outcome(False, "reject", decision, rule, rule.status, retry)
