"""`RuleEngine` and `AsyncRuleEngine`: a `RuleSet` bound to a store, one
``hit_many`` per request, and reloads that never leave a bad rule set in force.

Everything but the store calls and the sleeping lives once in `_Core`: building
the limiters, planning which of them to call, turning their Decision into an
`Outcome`, reloading. The shells make the store call of a plain request
themselves (a flow costs about 1 us, a quarter of such a check) and drive
`ratewarden.rules._actions`' flows for the rest.

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
import logging
import os
import signal
import threading
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Generic, TypeVar

from ..kernel import (
    AsyncLimiter,
    AsyncTurns,
    Limiter,
    Load,
    LoadSignals,
    Turns,
    ahit_many,
    ahit_tiers,
    hit_many,
    hit_tiers,
)
from ..primitives import ConfigurationError, Decision, adrive, drive
from ..stores import AsyncMemoryStore, AsyncStore, Store
from . import _actions as act
from ._actions import Outcome, ShadowLog
from ._compile import Applicable, LimitSpec, RuleSet, load
from ._engine_overrides import AsyncOverrides, Overrides
from ._limits_in_force import adaptive_of, in_force
from ._override_stores import Snapshot
from ._override_view import OverrideView
from ._unidentified import IdentityRules, refusal
from ._watcher import AsyncWatcher, Watcher
from .overrides import AuditEntry, RuntimeOverride, UnknownRule

__all__ = ["AsyncRuleEngine", "RuleEngine"]


log = logging.getLogger("ratewarden.rules")

L = TypeVar("L", Limiter, AsyncLimiter)
S = TypeVar("S", Store, AsyncStore)
_NO_LIMITS: tuple[Applicable, ...] = ()
_HELD = ("delay", "queue")  # outcomes that ``check(wait=True)`` holds
_SHAPED = ("queue", "degrade")  # actions whose limits `_actions.shaped` counts

# How a request's limits are counted (`_Core._sorted`): in one store call of the
# store's own tiers; through `hit_tiers`, which prices adaptive tiers and drives
# shards; or by `_actions.shaped`, for a queue or degrade limit among them
_DIRECT, _PRICED, _SHAPED_CALLS = 0, 1, 2


@dataclass(frozen=True, slots=True)
class _Bound(Generic[L]):
    """A rule set and its limiters, swapped in as one object so a request sees
    either the old pair or the new, never a mix."""

    ruleset: RuleSet
    limiters: tuple[L, ...]
    specs: tuple[LimitSpec, ...]  # the limits in force: the rule set's, or an override's
    overridden: frozenset[int]  # the slots whose limit is an override's
    adaptive: frozenset[int]  # the slots whose limit follows a load signal
    direct: tuple[Any, ...]  # per slot, the limiter's `direct` store handle (or None)


def _in_force(applicable: Applicable, spec: LimitSpec) -> Applicable:
    return Applicable(applicable.rule, applicable.slot, applicable.key, applicable.cost, spec)


class _Core(Generic[L, S]):
    """The engine without I/O, on ``store`` (its runtime overrides in a part of
    its own, `Overrides`): the shells add ``check``/``acheck``, the override
    methods, and name their kinds of limiter and line."""

    store: S
    _bound: _Bound[L]
    _limiter_class: type[L]
    _lines_class: type[Turns] | type[AsyncTurns]
    _overrides_class: type[Overrides] | type[AsyncOverrides]

    def __init__(
        self, source: RuleSet | str | os.PathLike[str], store: S, *, overrides: bool = True,
        overrides_namespace: str = "ratewarden",
    ) -> None:  # fmt: skip
        self.store = store
        # The async memory store answers at once: its sync face spares a check the
        # coroutine of an await that never waits (not a subclass's: it may do more)
        given: Any = store  # S is the store protocols, which the memory store's class is not
        memory = given if type(given) is AsyncMemoryStore else None
        self._hit_tiers_now: Callable[[list[Any], list[Any]], Any] | None = (
            None if memory is None else memory.sync.hit_tiers
        )
        clock = store.clock
        self._view = OverrideView(clock)
        # the load signals of the adaptive rules: this engine's own (see _adaptive)
        self.signals = LoadSignals()
        if isinstance(source, RuleSet):
            self.path: Path | None = None if source.source is None else Path(source.source)
            ruleset = source
            if self.path is not None and not self.path.exists():
                self.path = None  # compiled from text: nothing to reload from
        else:
            self.path = Path(source)
            ruleset = load(self.path)
        self.last_error: ConfigurationError | None = None
        self._identity_rules: IdentityRules | None = None  # built on first need
        self._reloading = threading.Lock()
        self._install(ruleset)
        self._overrides = self._overrides_class(
            store, enabled=overrides, namespace=overrides_namespace, ruleset=lambda: self.ruleset,
            build=self._limiter, change=self._change_overrides,
            take=weakref.WeakMethod(self._take_overrides),
        )  # fmt: skip
        self._lines = self._lines_class(clock)  # delayed requests of priority_from rules
        # what log_only rules would deny, logged; replace it to log more or less
        self.shadow_log = ShadowLog(clock)

    def _limiter(self, spec: LimitSpec) -> L:
        store: Any = self.store  # of the limiter's kind, as the shell's type says
        return self._limiter_class(
            spec.rate, store=store, algorithm=spec.algorithm, burst=spec.burst,
            refill=spec.refill, name=spec.name, on_failure=spec.on_failure,
            two_tier=spec.two_tier, shards=spec.shards,
            adaptive=adaptive_of(spec, self.signals),
        )  # fmt: skip

    def _change_overrides(self, edit: Callable[[OverrideView], bool]) -> None:
        """Edit the overrides in force, under the lock reloads take; the limits
        are built again when the edit says they changed."""
        with self._reloading:
            if edit(self._view):
                self._install(self._bound.ruleset)

    def _take_overrides(self, snapshot: Snapshot) -> None:
        """Put the overrides a store holds in force (its clock, its records)."""
        self._change_overrides(lambda view: view.take(snapshot))

    @property
    def overrides_source(self) -> Any:
        """Where the overrides live: this Redis's (shared by every engine on it),
        this process's, or None (``overrides=False``)."""
        return self._overrides.source

    @overrides_source.setter
    def overrides_source(self, source: Any) -> None:
        self._overrides.source = source

    def _expire_overrides(self) -> None:
        with self._reloading:
            if self._view.expire():
                self._install(self._bound.ruleset)

    def _install(self, ruleset: RuleSet) -> None:
        # Limiters with the same name and limit on the same store share counters,
        # so rules unchanged by a reload keep counting where they were. Runtime
        # overrides replace some limits (see _overrides).
        bound = getattr(self, "_bound", None)
        previous = None if bound is None else (bound.ruleset, bound.specs, bound.limiters)
        specs, limiters = self._view.limiters(ruleset, self._limiter, previous)
        overridden = frozenset(n for n, spec in enumerate(specs) if spec is not ruleset.limits[n])
        adaptive = frozenset(n for n, limiter in enumerate(limiters) if limiter.scale is not None)
        self.signals.known = ruleset.signals
        direct = tuple(limiter.direct for limiter in limiters)
        self._bound = _Bound(ruleset, limiters, specs, overridden, adaptive, direct)

    def set_load(self, signal: str, value: float | Load) -> None:
        """Feed a load signal the adaptive rules read: a finite number, or a
        callable returning one (read at most once per rule's interval). A signal
        no rule reads is a `ConfigurationError`."""
        self.signals.set(signal, value)

    def effective_limits(self) -> dict[str, tuple[int, int]]:
        """Every adaptive limit in force, by its name: (the limit in force without
        the load, the limit the load leaves now), in requests."""
        bound = self._bound
        out: dict[str, tuple[int, int]] = {}
        for slot in sorted(bound.adaptive):
            spec = bound.specs[slot]
            full = spec.rate.limit if spec.burst is None else spec.burst
            out[spec.name] = (full, bound.limiters[slot].effective_limit)
        return out

    @property
    def ruleset(self) -> RuleSet:
        return self._bound.ruleset

    def _limiters_of(self, rule: str | None) -> tuple[L, ...]:
        """The limiters in force (of ``rule``, if named): an override's, an
        adaptive limit's, a sharded or two-tier one's, as the checks count them."""
        bound = self._bound  # read once: a reload in between cannot mix two rule sets
        if rule is None:
            return bound.limiters
        ruleset = bound.ruleset
        compiled = ruleset.by_name.get(rule)
        if compiled is None:
            raise UnknownRule(f"no rule named {rule!r} in the rules in force")
        by_limit = ruleset.by_limit_name
        return tuple(
            limiter
            for spec, limiter in zip(ruleset.limits, bound.limiters, strict=True)
            if by_limit[spec.name] is compiled
        )

    def reload(self) -> RuleSet:
        """Load the rule file again and put it in force; a file that fails to load
        raises `RuleFileError` and leaves the rules in force as they were."""
        if self.path is None:
            raise ConfigurationError("this engine was built from rules in memory: no file")
        # One reload at a time (watcher, SIGHUP, API): an older, slower load must
        # not put its rules in force after a newer one did.
        with self._reloading:
            try:
                ruleset = load(self.path)
            except ConfigurationError as exc:
                self.last_error = exc
                raise
            self._install(ruleset)
            self.last_error = None
        for warning in ruleset.warnings:
            log.warning("%s", warning)
        return ruleset

    def try_reload(self) -> bool:
        """`reload`, logging a failure instead of raising it; True if reloaded."""
        try:
            self.reload()
        except ConfigurationError as exc:
            log.error("rule file not reloaded, the previous rules stay in force: %s", exc)
            return False
        return True

    def use(self, ruleset: RuleSet) -> None:
        """Put an already compiled rule set in force (an API-driven reload)."""
        with self._reloading:
            self._install(ruleset)

    def watch(self, interval: float = 1.0) -> Watcher:
        """Reload whenever the rule file changes, checked every ``interval`` seconds
        by a daemon thread; ``stop()`` the returned `Watcher` to end it."""
        watcher = Watcher(self, interval)
        watcher.start()
        return watcher

    def reload_on_sighup(self) -> Callable[[], None]:
        """Reload on SIGHUP (installed from the main thread, as Python requires);
        returns a function that puts the previous handler back. The handler only
        starts a thread that reloads: reloading in the handler itself could wait
        forever on a store lock the interrupted code holds, and a 10,000-rule file
        takes about 2 s to load."""
        if self.path is None:
            raise ConfigurationError("this engine was built from rules in memory: no file")

        def on_sighup(signum: int, frame: FrameType | None) -> None:
            threading.Thread(target=self.try_reload, name="ratewarden-sighup", daemon=True).start()

        previous = signal.signal(signal.SIGHUP, on_sighup)

        def restore() -> None:
            signal.signal(signal.SIGHUP, previous)

        return restore

    def __repr__(self) -> str:
        ruleset = self._bound.ruleset
        source = "" if self.path is None else f" from {str(self.path)!r}"
        return f"<{type(self).__name__} {len(ruleset)} rules{source} on {self.store!r}>"

    def _sorted(
        self, attributes: Mapping[str, object], cost: int = 1
    ) -> tuple[RuleSet, list[Applicable], list[Any], list[Any], int]:
        """The rule set in force, the limits that apply, the tiers of the store
        call (enforced, shadow) and how they are counted: ``_DIRECT``, the store's
        own ``(handle, key, cost)`` for one `hit_tiers` of the store; else the
        limiters' ``(limiter, key, cost)``, for `hit_tiers` (``_PRICED``: an
        adaptive or sharded limit among them) or `_actions.shaped`."""
        if type(cost) is not int or cost < 1:
            raise ConfigurationError(f"cost must be an integer >= 1, got {cost!r}")
        expiry = self._view.next_expiry  # None unless an override is in force
        if expiry is not None and self._view.clock.time_ns() >= expiry:
            self._expire_overrides()
        bound = self._bound  # read once: a reload in between cannot mix two rule sets
        applicable = bound.ruleset.evaluate(attributes)
        overridden = bound.overridden
        if overridden:  # the limits in force, for the headers and the reports
            specs = bound.specs
            applicable = [
                a if a.slot not in overridden else _in_force(a, specs[a.slot]) for a in applicable
            ]
        adaptive = bound.adaptive
        if adaptive:  # and an adaptive limit's size now
            specs = bound.specs
            applicable = [
                a if a.slot not in adaptive else in_force(a, specs, bound.limiters)
                for a in applicable
            ]
        direct = bound.direct
        enforced: list[Any] = []
        shadow: list[Any] = []
        how = _DIRECT
        for a in applicable:
            action = a.rule.action
            handle = direct[a.slot]
            if handle is None:
                how = how or _PRICED
            if action == "log_only":
                shadow.append((handle, a.key, a.cost * cost))
            else:
                enforced.append((handle, a.key, a.cost * cost))
                if action in _SHAPED:
                    # a request that meets no queue or degrade limit takes the plain
                    # path, whatever else the rule set holds: a flow costs a quarter
                    # of a check
                    how = _SHAPED_CALLS
        if how != _DIRECT:  # the limiters themselves: rare enough to sort twice
            limiters = bound.limiters
            enforced = [(limiters[a.slot], a.key, a.cost * cost)
                        for a in applicable if a.rule.action != "log_only"]  # fmt: skip
            shadow = [(limiters[a.slot], a.key, a.cost * cost)
                      for a in applicable if a.rule.action == "log_only"]  # fmt: skip
        return bound.ruleset, applicable, enforced, shadow, how

    def _refused_unidentified(
        self, ruleset: RuleSet, attributes: Mapping[str, object], applicable: list[Applicable]
    ) -> Outcome | None:
        """The refusal of a ``fail_closed`` rule that needs the identity the
        request lacks, or None: the request is checked as usual."""
        rules = self._identity_rules
        if rules is None or rules.ruleset is not ruleset:
            rules = self._identity_rules = IdentityRules(ruleset)
        rule = rules.refusing(attributes, applicable)
        if rule is None:
            return None
        bound = self._bound
        return refusal(rule, bound.specs if bound.ruleset is ruleset else ruleset.limits)

    def _outcome(
        self,
        ruleset: RuleSet,
        applicable: list[Applicable],
        decision: Decision | None,
        shadow: Decision | None,
    ) -> Outcome:
        limits = tuple(applicable) if applicable else _NO_LIMITS
        if shadow is not None and not shadow.allowed:
            self.shadow_log.would_deny(shadow, limits)
        if decision is None or decision.allowed:
            return Outcome(True, "allow", decision, shadow=shadow, limits=limits)
        rule = ruleset.by_limit_name.get(decision.rule or "")
        retry = decision.retry_after
        if rule is None or rule.action in ("reject", "queue"):  # queue: the line is full
            status = 429 if rule is None else rule.status
            return Outcome(False, "reject", decision, rule, status, retry, limits=limits)
        if rule.action == "shadow_ban":
            response = rule.response
            return Outcome(
                False, "shadow_ban", decision, rule, response.status, retry, 0.0, response,
                limits=limits,
            )  # fmt: skip
        # delay (log_only never denies: those limits are not in the enforced call)
        if rule.max_wait is not None and retry <= rule.max_wait:
            return Outcome(False, "delay", decision, rule, 429, retry, retry, limits=limits)
        return Outcome(False, "reject", decision, rule, 429, retry, limits=limits)


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
        ruleset, applicable, enforced, shadow, how = self._sorted(attributes, cost)
        if not identified:
            refused = self._refused_unidentified(ruleset, attributes, applicable)
            if refused is not None:
                return refused
        if not applicable:
            return self._outcome(ruleset, applicable, None, None)
        if how == _DIRECT:
            decision, report = self.store.hit_tiers(enforced, shadow)
        elif how == _PRICED:
            decision, report = hit_tiers(enforced, shadow)
        else:
            counted = drive(act.shaped(ruleset, enforced, shadow, hit_tiers, hit_many))
            return act.shaped_outcome(self._outcome, ruleset, applicable, counted)
        return self._outcome(ruleset, applicable, decision, report)


class AsyncRuleEngine(_Core[AsyncLimiter, AsyncStore]):
    """The asyncio twin of `RuleEngine`: `AsyncLimiter`\\ s on an async store,
    ``await engine.acheck(attributes)``."""

    _limiter_class = AsyncLimiter
    _lines_class = AsyncTurns
    _overrides_class = AsyncOverrides
    _overrides: AsyncOverrides

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
        ruleset, applicable, enforced, shadow, how = self._sorted(attributes, cost)
        if not identified:
            refused = self._refused_unidentified(ruleset, attributes, applicable)
            if refused is not None:
                return refused
        if not applicable:
            return self._outcome(ruleset, applicable, None, None)
        if how == _DIRECT:
            now = self._hit_tiers_now
            if now is not None:
                decision, report = now(enforced, shadow)
            else:
                decision, report = await self.store.hit_tiers(enforced, shadow)
        elif how == _PRICED:
            decision, report = await ahit_tiers(enforced, shadow)
        else:
            counted = await adrive(act.shaped(ruleset, enforced, shadow, ahit_tiers, ahit_many))
            return act.shaped_outcome(self._outcome, ruleset, applicable, counted)
        return self._outcome(ruleset, applicable, decision, report)
