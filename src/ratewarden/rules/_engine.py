"""`RuleEngine` and `AsyncRuleEngine`: a `RuleSet` bound to a store, one
``hit_many`` per request, and reloads that never leave a bad rule set in force.

Everything but the store calls and the sleeping lives once in `_Core`
(`_engine_core`): building the limiters, sorting the limits a request meets into
one store call, turning their Decision into an `Outcome`, reloading. The
shells make the store call of a plain request themselves (a flow costs about
1 us, a quarter of such a check) and drive `ratewarden.rules._actions`' flows
for the rest.

Per request:

1. ``ruleset.evaluate(attributes)`` (pure) gives the applicable limits;
2. every limit of a rule whose action is not ``log_only`` goes into ONE
   ``hit_many`` call: admitted only if all pass, and then counted in all; a
   denied request counts nowhere;
3. in the same store call (one hold of the memory store's lock, one Redis
   script), if that admitted the request (or nothing was enforced), the
   ``log_only`` limits are checked as a second all-or-nothing set, reported as
   ``Outcome.shadow``, never blocking. Shadow limits therefore count what they
   would count if they were enforced next to the others: a request the enforced
   limits deny would have been denied anyway and is not counted there. Shadow
   tiers are atomic among themselves: while one is over, the others do not
   count either. (In a Redis Cluster, when the tiers span slots, the shadow set
   is a second call.) When they would deny, `ShadowLog` logs it (a line per rule
   and key, within its own limits);
4. a denial is answered with the action of the rule that denied (the tier
   with the longest ``retry_after``): ``reject`` with its status; ``delay`` with
   the wait when it fits in ``max_wait`` (``check(..., wait=True)`` waits on the
   store's clock and checks again), else reject; ``shadow_ban`` with its response.

A request whose caller could not be identified (``unidentified``, when the
application's ``identify`` raised) is planned the same way on the attributes it
has; a ``fail_closed`` rule that needs the identity and could apply refuses it
first (`ratewarden.rules._unidentified`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence

from ..kernel import (
    AsyncLimiter,
    AsyncTurns,
    Limiter,
    Turns,
    ahit_many,
    ahit_tiers,
    hit_many,
    hit_tiers,
)
from ..primitives import adrive, drive
from ..stores import AsyncStore, Store
from ..stores.reservations import areserver, reserver
from . import _actions as act
from ._actions import Outcome
from ._engine_core import _HELD, _Core
from ._engine_overrides import AsyncOverrides, Overrides
from ._holds import Admission
from ._settle import Settled
from ._watcher import AsyncWatcher
from .overrides import AuditEntry, RuntimeOverride

__all__ = ["AsyncRuleEngine", "RuleEngine"]


class RuleEngine(_Core[Limiter, Store]):
    """Rules from a file (or a `RuleSet`) applied with `Limiter`\\ s on ``store``.

    ``check(attributes)`` counts a request against every limit that applies and
    returns an `Outcome`; ``reload()``, ``watch()`` and ``reload_on_sighup()``
    replace the rules without losing the counters of rules left unchanged.
    """

    _limiter_class = Limiter
    _lines_class = Turns
    _overrides_class = Overrides
    _overrides: Overrides
    _reserver_of = staticmethod(reserver)

    def set_override(
        self, rule: str, limits: Sequence[str] | str, *, duration: float | str, reason: str,
        by: str = "",
    ) -> RuntimeOverride:  # fmt: skip
        """Replace ``rule``'s rates with ``limits`` for ``duration`` (seconds, or
        text such as ``"30m"``), recorded with ``reason`` and ``by`` in the
        audit trail. Raises `UnknownRule` or `ConfigurationError` for an override
        that cannot apply to the rules in force, `StoreUnavailable` when Redis
        cannot be reached."""
        return self._overrides.set(rule, limits, duration, reason, by)

    def clear_override(self, rule: str, *, reason: str = "", by: str = "") -> bool:
        """End ``rule``'s override now; False if it had none in force."""
        return self._overrides.clear(rule, reason, by)

    def list_overrides(self) -> list[RuntimeOverride]:
        """The overrides in force in the store (all rule files'), by rule name."""
        return self._overrides.listed()

    def override_audit(self, count: int = 100) -> list[AuditEntry]:
        """The last ``count`` changes, newest first (1000 are kept)."""
        return self._overrides.audit(count)

    def close(self) -> None:
        """Stop following the store's overrides (a Redis store's)."""
        self._overrides.close()

    def check(
        self, attributes: Mapping[str, object], *, wait: bool = False, cost: int = 1
    ) -> Outcome:
        """Count the request described by ``attributes``. With ``wait=True`` a
        ``delay`` outcome is waited out on the store's clock (up to the rule's
        ``max_wait`` in all) and the request checked again. ``cost`` multiplies what
        every rule charges (a batch of ``cost`` requests checked as one, as the
        service's ``cost`` field and envoy's ``hits_addend`` ask)."""
        outcome = self._check_once(attributes, cost)
        if not wait or outcome.action not in _HELD:  # the common case: nothing to hold
            return outcome
        return self._hold(outcome, attributes, cost, True)

    def acquire(
        self, attributes: Mapping[str, object], *, wait: bool = False, cost: int = 1,
        identified: bool = True,
    ) -> Admission:  # fmt: skip
        """`check`, and a slot of each concurrency rule that applies, taken first:
        a full one refuses the request (``delay`` with ``wait``: after up to its
        ``max_wait``), a refused request gives back what it took. Allowed, the
        `Admission`'s ``token`` names the slots; `release` them when the request
        ends (`renew` them while it lasts), or they end with their rule's
        ``lease``. `check` takes no slot. Not ``identified``: the rates are
        `unidentified`'s to decide."""
        decide = self.check if identified else self.unidentified
        check = functools.partial(decide, attributes, wait=wait, cost=cost)
        applying = self.ruleset.holds(attributes)
        sleep = self.store.clock.sleep
        return drive(self.holds.admitting(self._leases, applying, check, wait, sleep))

    def release(self, token: str) -> tuple[tuple[str, str], ...]:
        """Give back the slots of an `Admission`'s ``token``: their (rule, key). `BadToken`
        for a token no acquire handed out, `LeaseGone` for a slot not held
        (released already, or its lease ended): the others are released."""
        return drive(self.holds.releasing(self._leases(), token))

    def renew(self, token: str) -> float:
        """Push every slot of ``token`` on by its rule's ``lease``; the seconds until the first
        ends. `BadToken`, `LeaseGone` as `release` says (the others are renewed)."""
        return drive(self.holds.renewing(self._leases(), token, self.ruleset))

    def settle(self, token: str, *, status: int | None = None, cost: int | None = None) -> Settled:
        """Settle the hits of an `Outcome`'s ``settle`` token once the request ran:
        give back those its response ``status`` does not count, charge a ``settle``
        rule's actual ``cost``. `BadSettle` (`BadSettleToken`) for what it cannot
        take, `SettleRefused` for a token settled already or expired."""
        return drive(self.settles.settling(self._leases, token, status, cost, self._limit_in_force))

    def unidentified(
        self, attributes: Mapping[str, object], *, wait: bool = False, cost: int = 1
    ) -> Outcome:
        """`check` for a request whose caller could not be identified (the
        application's ``identify`` raised): ``attributes`` are what the request
        itself gives. A rule that needs the identity answers as its
        ``on_failure`` says (``fail_closed`` refuses; see
        `ratewarden.rules._unidentified`); the others apply as usual."""
        outcome = self._check_once(attributes, cost, False)
        if not wait or outcome.action not in _HELD:
            return outcome
        return self._hold(outcome, attributes, cost, False)

    def reset(self, key: str, rule: str | None = None) -> int:
        """Forget ``key`` in every limit in force (of ``rule``, if named: else
        `UnknownRule`), with the limiters the checks count in, so that an
        override's limit, an adaptive limit, shards and two-tier counts forget
        it too; how many limits."""
        limiters = self._limiters_of(rule)
        for limiter in limiters:
            limiter.reset(key)
        return len(limiters)

    def _hold(
        self, outcome: Outcome, attributes: Mapping[str, object], cost: int, identified: bool
    ) -> Outcome:
        again = functools.partial(self._check_once, attributes, cost, identified)
        sleep = self.store.clock.sleep
        return drive(act.holding(self._lines, outcome, attributes, again, sleep))

    def _check_once(
        self, attributes: Mapping[str, object], cost: int = 1, identified: bool = True
    ) -> Outcome:
        sorted_ = self._sorted(attributes, cost, identified)
        if type(sorted_) is Outcome:
            return sorted_
        ruleset, applicable, enforced, shadow, plain = sorted_  # type: ignore[misc]
        if not plain:
            counted = drive(self._shape(ruleset, enforced, shadow, cost, hit_tiers, hit_many))
            return act.shaped_outcome(self._outcome, ruleset, applicable, counted)
        decision, report = self.store.hit_tiers(enforced, shadow)
        return self._outcome(ruleset, applicable, decision, report)


class AsyncRuleEngine(_Core[AsyncLimiter, AsyncStore]):
    """The asyncio twin of `RuleEngine`: `AsyncLimiter`\\ s on an async store,
    ``await engine.acheck(attributes)``."""

    _limiter_class = AsyncLimiter
    _lines_class = AsyncTurns
    _overrides_class = AsyncOverrides
    _overrides: AsyncOverrides
    _reserver_of = staticmethod(areserver)

    async def astart(self) -> None:
        """Read the store's overrides now and follow them from here on (the
        first check does this by itself; a service calls it at start-up so the
        overrides are in force before the first request)."""
        await self._overrides.start()

    async def aset_override(
        self, rule: str, limits: Sequence[str] | str, *, duration: float | str, reason: str,
        by: str = "",
    ) -> RuntimeOverride:  # fmt: skip
        """The twin of `RuleEngine.set_override`."""
        return await self._overrides.set(rule, limits, duration, reason, by)

    async def aclear_override(self, rule: str, *, reason: str = "", by: str = "") -> bool:
        """The twin of `RuleEngine.clear_override`."""
        return await self._overrides.clear(rule, reason, by)

    async def alist_overrides(self) -> list[RuntimeOverride]:
        """The twin of `RuleEngine.list_overrides`."""
        return await self._overrides.listed()

    async def aoverride_audit(self, count: int = 100) -> list[AuditEntry]:
        """The twin of `RuleEngine.override_audit`."""
        return await self._overrides.audit(count)

    async def aclose(self) -> None:
        """Stop following the store's overrides."""
        await self._overrides.close()

    async def acheck(
        self, attributes: Mapping[str, object], *, wait: bool = False, cost: int = 1
    ) -> Outcome:
        """The twin of `RuleEngine.check`; waiting never blocks the event loop."""
        outcome = await self._acheck_once(attributes, cost)
        if not wait or outcome.action not in _HELD:  # the common case: nothing to hold
            return outcome
        return await self._ahold(outcome, attributes, cost, True)

    async def aacquire(
        self, attributes: Mapping[str, object], *, wait: bool = False, identified: bool = True,
        cost: int = 1,
    ) -> Admission:  # fmt: skip
        """The twin of `RuleEngine.acquire`; waiting never blocks the event loop."""
        decide = self.acheck if identified else self.aunidentified
        check = functools.partial(decide, attributes, wait=wait, cost=cost)
        applying = self.ruleset.holds(attributes)
        sleep = self.store.clock.asleep
        return await adrive(self.holds.admitting(self._leases, applying, check, wait, sleep))

    async def arelease(self, token: str) -> tuple[tuple[str, str], ...]:
        """The twin of `RuleEngine.release`."""
        return await adrive(self.holds.releasing(self._leases(), token))

    async def arenew(self, token: str) -> float:
        """The twin of `RuleEngine.renew`."""
        return await adrive(self.holds.renewing(self._leases(), token, self.ruleset))

    async def asettle(
        self, token: str, *, status: int | None = None, cost: int | None = None
    ) -> Settled:
        """The twin of `RuleEngine.settle`."""
        flow = self.settles.settling(self._leases, token, status, cost, self._limit_in_force)
        return await adrive(flow)

    async def aunidentified(
        self, attributes: Mapping[str, object], *, wait: bool = False, cost: int = 1
    ) -> Outcome:
        """The twin of `RuleEngine.unidentified`."""
        outcome = await self._acheck_once(attributes, cost, False)
        if not wait or outcome.action not in _HELD:
            return outcome
        return await self._ahold(outcome, attributes, cost, False)

    async def areset(self, key: str, rule: str | None = None) -> int:
        """The twin of `RuleEngine.reset`; the limits forget it at once (a Redis
        store's in concurrent calls)."""
        limiters = self._limiters_of(rule)
        await asyncio.gather(*[limiter.reset(key) for limiter in limiters])
        return len(limiters)

    async def _ahold(
        self, outcome: Outcome, attributes: Mapping[str, object], cost: int, identified: bool
    ) -> Outcome:
        again = functools.partial(self._acheck_once, attributes, cost, identified)
        sleep = self.store.clock.asleep
        return await adrive(act.holding(self._lines, outcome, attributes, again, sleep))

    def awatch(
        self,
        interval: float = 1.0,
        *,
        reload: Callable[[], Awaitable[object]] | None = None,
    ) -> AsyncWatcher:
        """A watcher of the rule file for the event loop: ``run()`` it as a task
        (cancel the task to stop it); every ``interval`` seconds it looks, and on
        a change awaits ``reload`` (default: `reload` in a thread, since a large
        file takes seconds to compile). A file that does not load is logged and
        the rules in force stay."""
        if reload is None:
            reload = functools.partial(asyncio.to_thread, self.reload)
        return AsyncWatcher(self.path, interval, reload)

    async def _acheck_once(
        self, attributes: Mapping[str, object], cost: int = 1, identified: bool = True
    ) -> Outcome:
        if self._overrides.pending:  # a Redis store's overrides: followed from the first check
            self._overrides.follow()
        sorted_ = self._sorted(attributes, cost, identified)
        if type(sorted_) is Outcome:
            return sorted_
        ruleset, applicable, enforced, shadow, plain = sorted_  # type: ignore[misc]
        if not plain:
            counted = await adrive(
                self._shape(ruleset, enforced, shadow, cost, ahit_tiers, ahit_many)
            )
            return act.shaped_outcome(self._outcome, ruleset, applicable, counted)
        now = self._hit_tiers_now
        if now is not None:
            decision, report = now(enforced, shadow)
        else:
            decision, report = await self.store.hit_tiers(enforced, shadow)
        return self._outcome(ruleset, applicable, decision, report)
