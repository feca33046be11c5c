"""The rule engine without I/O (`_Core`): building the limiters of a rule set,
sorting the limits a request meets into one store call, turning the Decisions
into an `Outcome`, reloading, the overrides in force. `_engine` holds the shells,
`RuleEngine` and `AsyncRuleEngine`, which make the store calls, sleep and wait.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import weakref
from collections.abc import Callable, Mapping
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
)
from ..primitives import ConfigurationError, Decision
from ..stores import AsyncMemoryStore, AsyncStore, Store
from ._actions import Outcome, ShadowLog, shaped
from ._compile import Applicable, LimitSpec, RuleSet, load
from ._engine_overrides import AsyncOverrides, Overrides
from ._holds import Holds
from ._limits_in_force import adaptive_of, in_force
from ._override_stores import Snapshot
from ._override_view import OverrideView
from ._settle import Settles
from ._unidentified import IdentityRules, refusal
from ._watcher import Watcher
from .overrides import UnknownRule

__all__ = ["L", "S"]  # and _Core, for the shells in _engine


log = logging.getLogger("ratewarden.rules")

L = TypeVar("L", Limiter, AsyncLimiter)
S = TypeVar("S", Store, AsyncStore)
_NO_LIMITS: tuple[Applicable, ...] = ()
_HELD = ("delay", "queue")  # outcomes that ``check(wait=True)`` holds
_SHAPED = ("queue", "degrade")  # actions whose limits `_actions.shaped` counts (see _sorted)


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
    _reserver_of: Callable[[Any, Any], Any]  # a limit's reservations, sync or async

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
        # the concurrency rules' slots: lease ids, waits and figures (`_holds`)
        self.holds = Holds(clock)
        self._lease_table: Any = None
        # the hits settled after the request ran: their tokens and flows (`_settle`)
        self.settles = Settles(clock, store, type(self)._reserver_of)

    def _leases(self) -> Any:
        """The store's lease table, where the concurrency rules keep their slots."""
        if self._lease_table is None:
            leases = getattr(self.store, "leases", None)
            if not callable(leases):
                raise ConfigurationError(
                    f"{type(self.store).__name__} keeps no lease tables: the concurrency"
                    " rules need a store with leases(), such as the memory or the Redis store"
                )
            self._lease_table = leases()
        return self._lease_table

    def _limit_in_force(self, name: str) -> tuple[Any, L] | None:
        """The rule and the limiter in force of the limit named ``name``, or None."""
        bound = self._bound  # read once: a reload in between cannot mix two rule sets
        rule = bound.ruleset.by_limit_name.get(name)
        if rule is None:
            return None
        limits = bound.ruleset.limits
        slot = next(slot for slot in rule.slots if limits[slot].name == name)
        return rule, bound.limiters[slot]

    def _limiter(self, spec: LimitSpec) -> L:
        store: Any = self.store  # of the limiter's kind, as the shell's type says
        return self._limiter_class(
            spec.rate, store=store, algorithm=spec.algorithm, burst=spec.burst,
            refill=spec.refill, name=spec.name, on_failure=spec.on_failure,
            two_tier=spec.two_tier, shards=spec.shards,
            adaptive=adaptive_of(spec, self.signals),
            calendar=None if spec.calendar is None else spec.calendar.tz,
            week_start="monday" if spec.calendar is None else spec.calendar.week_start,
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
        self, attributes: Mapping[str, object], cost: int = 1, identified: bool = True
    ) -> tuple[RuleSet, list[Applicable], list[Any], list[Any], bool] | Outcome:
        """The rule set in force, the limits that apply, the tiers of the store
        call (enforced, shadow) and whether they are direct: the store's own
        ``(handle, key, cost)``, for one `hit_tiers` of the store; else the
        limiters' ``(limiter, key, cost)``, for `_actions.shaped`, which prices
        adaptive limits, drives shards (both through `hit_tiers`), and makes the
        calls of queue and degrade limits. Or the `Outcome` of a request with
        nothing to count: no limit applies, or a ``fail_closed`` rule refuses a
        caller not ``identified``."""
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
        plain = True
        for a in applicable:
            action = a.rule.action
            handle = direct[a.slot]
            if handle is None:
                plain = False
            if action == "log_only":
                shadow.append((handle, a.key, a.cost * cost))
            else:
                enforced.append((handle, a.key, a.cost * cost))
                if action in _SHAPED:
                    # a request that meets no queue or degrade limit takes the plain
                    # path, whatever else the rule set holds: a flow costs a quarter
                    # of a check
                    plain = False
        if plain and bound.ruleset.settling:  # reserved, then settled (`_settle`)
            plain = not any(a.rule.settles for a in applicable)
        if not plain:  # the limiters themselves: rare enough to sort twice
            limiters = bound.limiters
            enforced = [(limiters[a.slot], a.key, a.cost * cost)
                        for a in applicable if a.rule.action != "log_only"]  # fmt: skip
            shadow = [(limiters[a.slot], a.key, a.cost * cost)
                      for a in applicable if a.rule.action == "log_only"]  # fmt: skip
        ruleset = bound.ruleset
        if not identified:
            refused = self._refused_unidentified(ruleset, attributes, applicable)
            if refused is not None:
                return refused
        if not applicable:
            return self._outcome(ruleset, applicable, None, None)
        return ruleset, applicable, enforced, shadow, plain

    def _shape(  # noqa: PLR0917 - the twins' one call, kept on one line each
        self, ruleset: RuleSet, enforced: list[Any], shadow: list[Any], cost: int,
        tiers: Callable[..., Any], many: Callable[..., Any],
    ) -> Any:  # fmt: skip
        """`_actions.shaped` for this engine: its settled hits too."""
        return shaped(ruleset, enforced, shadow, tiers, many, settles=self.settles, cost=cost)

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
