"""Hits settled after the request ran, written once as flows (`ratewarden.primitives.drive`
and ``adrive`` run them for `RuleEngine` and `AsyncRuleEngine`).

A rule with ``count`` (count a request by its response's status) or ``settle:
true`` (the check's cost is an estimate) takes its hit as a reservation
(`ratewarden.Limiter.reserve`): admitted or refused when the request is
checked, before it runs, so a caller over the limit is refused as usual. The
allowed `Outcome` carries a **token** naming each hit taken: the limit, the key,
the rule's cost per request, the cost taken and the mark of the window it was
counted in. ``settle(token, status=..., cost=...)`` then applies, per hit, the
difference between what it should have cost and what it took
(`ratewarden.algorithms.settle`): nothing for a counted status, the whole hit
back for one that does not count, ``cost`` times the rule's cost for a ``settle``
rule. A token never settled leaves its hits charged in full.

A token is opaque to its holder and carries all a settle needs, so no state is
kept per request: it is signed (HMAC-SHA256 under the engine's ``secret``), so a
holder cannot make one up, and it expires ``within`` seconds after the check.
A settle takes a lease named after the token in the store's lease table
(`ratewarden.stores.leases`) that lasts until the token expires: a second settle
of one token finds it and is refused, in every process on the store. What a
holder can do is therefore only this: report its own request's status or cost,
truthfully or not, once. A client that lies about its status gets its own hits
back, on the keys its own requests were counted under; the service's clients
are the gateways and applications it trusts with its check, not end users.

Hits that do not settle go back when another limit refuses the request, as the
concurrency rules' slots do (`_holds`): a refused request counts nowhere.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
import weakref
import zlib
from collections.abc import Callable, Generator
from dataclasses import dataclass
from functools import partial
from typing import Any

import msgspec

from ..primitives import Clock, Decision
from ..stores import pick
from ..stores.leases import OK

__all__ = ["BadSettle", "BadSettleToken", "SettleRefused", "Settled", "Settles"]

MAX_TOKEN = 16_384  # characters: a token longer than this was never handed out
WITHIN = 600.0  # seconds a token can be settled in, by default
_SIGNATURE = 16  # bytes of the HMAC a token carries

# (limit name, key, cost per request, cost taken, mark, CRC-32 of the limit's key prefix)
Hit = tuple[str, str, int, int, int, int]
Tier = tuple[Any, str, int]  # (limiter, key, cost), as `_actions.shaped` has them


class BadSettle(ValueError):
    """A settle the engine refuses for what it says: no status where a rule of the
    token counts by response, a status or cost that is not one."""


class BadSettleToken(BadSettle):
    """A token no check of this engine's ``secret`` handed out."""


class SettleRefused(LookupError):
    """A token that cannot be settled any more: ``reason`` ``"settled"`` (it was,
    once) or ``"expired"`` (past ``within``; its hits stay charged)."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Settled:
    """What a settle did: per hit, the (rule, key, change) applied, a change
    below 0 given back, above 0 charged. A hit whose limit left the rules in
    force (or changed its rate) is left out: its counts are no longer read."""

    changes: tuple[tuple[str, str, int], ...]

    @property
    def refunded(self) -> int:
        return -sum(change for _, _, change in self.changes if change < 0)

    @property
    def charged(self) -> int:
        return sum(change for _, _, change in self.changes if change > 0)


class _Body(msgspec.Struct, array_like=True, frozen=True):
    nonce: str
    expires_ms: int  # on the engine's store clock
    hits: list[tuple[str, str, int, int, int, int]]


_encode_body = msgspec.msgpack.Encoder().encode
_decode_body = msgspec.msgpack.Decoder(_Body).decode


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _crc(limiter: Any) -> int:
    return zlib.crc32(limiter.key_prefix.encode())


class Settles:
    """The settled hits of one engine: its ``secret``, the reservations of its
    limits (``bind`` makes one for a limiter), the flows."""

    def __init__(self, clock: Clock, store: Any, bind: Callable[[Any, Any], Any]) -> None:
        self.clock = clock
        self.store = store
        self._bind = bind
        # the key tokens are signed with: random, so one process's tokens settle
        # only there, unless every process is given the same secret
        self.secret = secrets.token_bytes(32)
        self.within = WITHIN
        self._reservers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    def _reserver(self, limiter: Any) -> Any:
        held = self._reservers.get(limiter)
        if held is None:
            held = self._reservers[limiter] = self._bind(self.store, limiter.direct)
        return held

    def taking(
        self, tiers: list[Tier], cost: int
    ) -> Generator[Callable[[], Any], Any, tuple[Decision, list[Any]]]:
        """Reserve each of ``tiers`` (``cost``: the request's, that multiplied
        each rule's): the Decision that speaks for them, and what was taken. A
        refusal gives back what was taken and returns nothing taken."""
        taken: list[Any] = []
        decisions: list[Decision] = []
        for limiter, key, charged in tiers:
            reserver = self._reserver(limiter)
            decision, mark = yield partial(reserver.reserve, key, charged)
            decisions.append(decision)
            if not decision.allowed:
                yield from self.giving_back(taken)
                return decision, []
            if not decision.degraded:  # a degraded admission counted nothing
                taken.append((reserver, limiter, key, charged // cost, charged, mark))
        return pick(decisions), taken

    def giving_back(self, taken: list[Any]) -> Generator[Callable[[], Any], Any, None]:
        """Refund every hit ``taken`` (the request was refused elsewhere)."""
        for reserver, _, key, _, charged, mark in taken:
            yield partial(reserver.settle, key, -charged, mark, charged)

    def token(self, taken: list[Any]) -> str | None:
        """The token that names the hits ``taken``; None for none."""
        if not taken:
            return None
        expires = self.clock.time_ns() // 1_000_000 + round(self.within * 1000)
        hits = [(limiter.name, key, unit, charged, mark, _crc(limiter))
                for _, limiter, key, unit, charged, mark in taken]  # fmt: skip
        body = _encode_body(_Body(secrets.token_hex(12), expires, hits))
        signature = hmac.digest(self.secret, body, "sha256")[:_SIGNATURE]
        return f"{_b64(body)}.{_b64(signature)}"

    def _parse(self, token: object) -> _Body:
        if not isinstance(token, str) or not 0 < len(token) <= MAX_TOKEN:
            raise BadSettleToken(
                f"a settle token is the string a check answered, got {token!r:.80}"
            )
        text, _, signed = token.partition(".")
        try:
            body, signature = _unb64(text), _unb64(signed)
        except (ValueError, binascii.Error):
            body, signature = b"", b""
        expected = hmac.digest(self.secret, body, "sha256")[:_SIGNATURE]
        if not body or not hmac.compare_digest(signature, expected):
            raise BadSettleToken(
                f"settle token {token!r:.80} is not one a check here answered (garbled, or"
                " signed with another secret)"
            )
        try:
            return _decode_body(body)
        except msgspec.DecodeError:  # signed here: only a change of format gets here
            raise BadSettleToken(f"settle token {token!r:.80} is of another format") from None

    def settling(
        self,
        leases: Callable[[], Any],
        token: object,
        status: int | None,
        cost: int | None,
        in_force: Callable[[str], tuple[Any, Any] | None],
    ) -> Generator[Callable[[], Any], Any, Settled]:
        """Settle the hits ``token`` names by the response's ``status`` and the
        request's actual ``cost`` (see the module docstring); ``in_force`` gives a
        limit's (rule, limiter) in force by its name, or None."""
        if status is not None and (type(status) is not int or not 100 <= status <= 599):
            raise BadSettle(f"status is the response's HTTP status, 100 to 599, got {status!r}")
        if cost is not None and (type(cost) is not int or cost < 0):
            raise BadSettle(f"cost is the request's actual cost, a whole number >= 0, got {cost!r}")
        body = self._parse(token)
        left_ms = body.expires_ms - self.clock.time_ns() // 1_000_000
        if left_ms <= 0:
            raise SettleRefused(
                f"settle token {body.nonce} expired {-left_ms / 1000:g} s ago (a token settles"
                f" within {self.within:g} s of its check): its hits stay charged",
                reason="expired",
            )
        plan = self._plan(body, status, cost, in_force)
        table = leases()
        claim = yield partial(
            table.call, "take", f"rw:settled:{{{body.nonce}}}", body.nonce, 1, left_ms * 1000
        )
        if claim.status != OK:
            raise SettleRefused(f"settle token {body.nonce} is settled already", reason="settled")
        changes: list[tuple[str, str, int]] = []
        for rule, limiter, key, delta, mark, charged in plan:
            if delta:
                yield partial(self._reserver(limiter).settle, key, delta, mark, charged)
            changes.append((rule, key, delta))
        return Settled(tuple(changes))

    @staticmethod
    def _plan(
        body: _Body,
        status: int | None,
        cost: int | None,
        in_force: Callable[[str], tuple[Any, Any] | None],
    ) -> list[tuple[str, Any, str, int, int, int]]:
        """Per hit still in force: (rule, limiter, key, change, mark, cost taken)."""
        plan = []
        by_cost = False
        for name, key, unit, charged, mark, crc in body.hits:
            found = in_force(name)
            if found is None or _crc(found[1]) != crc:
                continue  # the limit is gone, or counts elsewhere now
            rule, limiter = found
            actual = charged
            if rule.rule.settle:
                by_cost = True
                if cost is not None:
                    actual = unit * cost
            if rule.counted_statuses is not None:
                if status is None:
                    raise BadSettle(
                        f"rule {rule.name!r} counts a request by its response: give the"
                        " response's status"
                    )
                if not rule.counts(status):
                    actual = 0
            plan.append((rule.name, limiter, key, actual - charged, mark, charged))
        if status is None and cost is None:
            raise BadSettle("a settle says the response's status, the actual cost, or both")
        if cost is not None and plan and not by_cost:
            raise BadSettle("cost given, and no rule of this token settles its cost (settle: true)")
        return plan
