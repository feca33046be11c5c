"""`Service`: the rule engine, the envoy configuration, the store and the metrics
that both front ends (HTTP and gRPC) call. Each check is one engine call.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError, RatewardenError, StoreError
from .._limiter import AsyncLimiter
from ..envoy import EnvoyOptions
from ..envoy import envoy_files as list_envoy_files
from ..rules import (
    AsyncEnvoyConfig,
    AsyncRuleEngine,
    EnvoyResult,
    EnvoyStats,
    Outcome,
    Override,
    RuleSet,
    load,
)
from ..stores import AsyncStore
from ._admin_api import OverrideList
from ._dashstats import DashboardStats
from ._metrics import Metrics
from ._quotas import MAX_SCRAPED
from ._refusals import InvalidRequest, NotFound, Unprocessable
from ._shapes import (
    CheckRequest,
    CheckResult,
    attribute_problem,
    descriptor_attributes,
    entries_of,
    envoy_result,
    outcome_result,
    overrides_of,
    rule_statuses,
    whole_cost,
)

if TYPE_CHECKING:
    from ..envoy import EnvoyWatcher
    from ..fleet import QuotaStatus
    from ._quotas import QuotaReader

__all__ = ["Service"]

log = logging.getLogger("ratewarden.server")


class Service:
    """What ``ratewarden serve`` serves, without the transports.

    ``domain`` is the envoy domain whose descriptors the YAML rules decide; the
    domains of ``envoy_files`` (files, or directories of them) follow
    envoyproxy/ratelimit's configuration, served as ``envoy_options`` say; any
    other domain has no limits (envoy's answer for a domain it does not know).
    With a Redis store, ``quotas`` reads the fleet quotas in it (None with the
    memory store); ``quota_member_metrics``: their gauges per member too.
    """

    def __init__(
        self,
        rules: str | os.PathLike[str] | RuleSet,
        store: AsyncStore,
        *,
        envoy_files: Sequence[str | os.PathLike[str]] = (),
        domain: str = "ratewarden",
        quota_member_metrics: bool = False,
        envoy_options: EnvoyOptions | None = None,
    ) -> None:
        self.store = store
        self.engine = AsyncRuleEngine(rules, store)
        self.envoy_files = tuple(Path(p) for p in envoy_files)
        self.envoy_options = EnvoyOptions() if envoy_options is None else envoy_options
        # one set of counters for the process: a reload keeps them counting
        self.envoy_stats = EnvoyStats(near_limit_ratio=self.envoy_options.near_limit_ratio)
        self.envoy = self._load_envoy()
        if self.envoy is not None and domain in self.envoy.domains:
            raise ConfigurationError(
                f"domain {domain!r} is both the rules' domain and in an envoy config file;"
                " pick another --domain"
            )
        self.domain = domain
        self.metrics = Metrics(quota_members=quota_member_metrics, envoy=self.envoy_stats)
        self.metrics.rules.set(len(self.engine.ruleset))
        self.metrics.adaptive.limits = self.engine.effective_limits
        self.metrics.adaptive.signals = self.engine.signals.values
        self.dashboard = DashboardStats.for_metrics(self.metrics)
        self.draining = False
        self.quotas: QuotaReader | None = None
        client = getattr(store, "client", None)  # a Redis store's (the memory store has none)
        if client is not None:
            from ._quotas import QuotaReader  # noqa: PLC0415 - the redis extra

            self.quotas = QuotaReader(client)

    def _load_envoy(self) -> AsyncEnvoyConfig | None:
        """The envoy files as they are now (None without any); files a directory
        holds that are not YAML are logged, never silently passed over."""
        if not self.envoy_files:
            return None
        found = list_envoy_files(self.envoy_files)
        for path in found.ignored:
            log.warning("envoy config: %s is not a .yaml/.yml file: not loaded", path)
        o = self.envoy_options
        return AsyncEnvoyConfig.load(
            *found.files, store=self.store, merge=o.merge, count_denied=o.count_denied,
            shadow_mode=o.shadow_mode, quota_mode=o.quota_mode, stats=self.envoy_stats,
        )  # fmt: skip

    # -- checks ---------------------------------------------------------------

    def validate(self, request: CheckRequest) -> int:
        """Everything about a check that can be wrong before it counts; its cost.
        A batch validates every check before counting any."""
        try:
            cost = whole_cost(request.cost)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        if request.attributes is not None:
            if request.domain is not None or request.descriptors is not None:
                raise InvalidRequest("give either attributes or domain + descriptors, not both")
            problem = attribute_problem(request.attributes)
            if problem is not None:
                raise Unprocessable(problem)
            return cost
        if request.domain is None or request.descriptors is None:
            raise InvalidRequest("give attributes, or a domain and at least one descriptor")
        entries = entries_of(request.descriptors)
        if not entries or any(not e for e in entries):
            raise InvalidRequest("a check needs descriptors, each with at least one entry")
        try:
            overrides_of(request.descriptors)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        return cost

    async def check(self, request: CheckRequest, *, wait: bool = False) -> CheckResult:
        """One check of the API's shape: attributes, or a domain and descriptors."""
        cost = self.validate(request)
        if request.attributes is not None:
            outcome = await self.check_attributes(request.attributes, cost, wait=wait)
            return outcome_result(outcome)
        domain, descriptors = request.domain, request.descriptors
        if domain is None or descriptors is None:  # validated above; for the type checker
            raise InvalidRequest("give attributes, or a domain and at least one descriptor")
        overrides = None if domain == self.domain else overrides_of(descriptors)
        return await self.check_descriptors(domain, entries_of(descriptors), cost, overrides)

    async def check_attributes(
        self, attributes: Mapping[str, object], cost: int = 1, *, wait: bool = False
    ) -> Outcome:
        outcome = await self.engine.acheck(attributes, cost=cost, wait=wait)
        self._count(outcome)
        return outcome

    async def check_descriptors(
        self,
        domain: str,
        descriptors: Sequence[Sequence[tuple[str, str]]],
        cost: int = 1,
        overrides: Sequence[Override | None] | None = None,
    ) -> CheckResult:
        result, _ = await self.check_envoy(domain, descriptors, cost, overrides)
        return result

    async def check_envoy(
        self,
        domain: str,
        descriptors: Sequence[Sequence[tuple[str, str]]],
        cost: int = 1,
        overrides: Sequence[Override | None] | None = None,
    ) -> tuple[CheckResult, EnvoyResult | None]:
        """`check_descriptors`, and the envoy answer behind it (None for the
        rules' own domain), for what only envoy's protocol carries."""
        if not descriptors:
            raise InvalidRequest("a check needs at least one descriptor")
        if domain == self.domain:
            # an envoy domain's empty descriptor has no limit (OK), as in envoy's
            # service; the rules would read it as a request without attributes
            if any(not entries for entries in descriptors):
                raise InvalidRequest("every descriptor needs at least one entry")
            attributes = descriptor_attributes(domain, descriptors)
            outcome = await self.check_attributes(attributes, cost)
            result = outcome_result(outcome)
            result.statuses = rule_statuses(outcome, len(descriptors))
            return result, None
        envoy = self.envoy
        if envoy is None:  # no envoy files: every other domain is unknown, so OK
            for _ in descriptors:
                self.envoy_stats.domain_not_found(domain)
            nothing = EnvoyResult(True, None, [None] * len(descriptors))
            return envoy_result(nothing), nothing
        try:
            answer = await envoy.acheck(domain, descriptors, cost, overrides)
        except ConfigurationError as exc:
            raise InvalidRequest(str(exc)) from None
        rules = [limit.path for limit in answer.limits if limit is not None]
        decision = answer.decision
        denied = decision.rule if decision is not None and not answer.overall_ok else None
        closest = decision.rule if decision is not None else None
        shadow = answer.shadow
        shadow_denied = shadow.rule if shadow is not None and not shadow.allowed else None
        self.metrics.count(rules, decision, denied, closest, shadow_denied)
        if rules:
            self.dashboard.requests += 1
            if denied is not None or shadow_denied is not None:
                self.dashboard.limited_envoy(answer, denied, shadow_denied)
        return envoy_result(answer), answer

    def _count(self, outcome: Outcome) -> None:
        if not outcome.limits:
            return
        rules = list(dict.fromkeys(a.rule.name for a in outcome.limits))
        decision = outcome.decision
        by_limit = self.engine.ruleset.by_limit_name
        closest = None
        if decision is not None and decision.rule is not None:
            rule = by_limit.get(decision.rule)
            closest = None if rule is None else rule.name
        denied = None
        if not outcome.allowed:
            denied = outcome.rule.name if outcome.rule is not None else closest
        shadow = outcome.shadow
        shadow_denied = None
        if shadow is not None and not shadow.allowed and shadow.rule is not None:
            rule = by_limit.get(shadow.rule)
            shadow_denied = shadow.rule if rule is None else rule.name
        self.metrics.count(rules, decision, denied, closest, shadow_denied)
        if outcome.degrade and outcome.rule is not None:
            self.metrics.degraded(outcome.rule.name)
        self.dashboard.requests += 1
        if denied is not None or shadow_denied is not None:
            self.dashboard.limited(outcome, denied, shadow_denied)

    # -- admin ----------------------------------------------------------------

    async def reload(self) -> dict[str, Any]:
        """Load the rule file (and envoy files) again; a bad file raises
        `ConfigurationError` and leaves everything in force as it was."""
        engine = self.engine
        try:
            if engine.path is None:
                raise ConfigurationError("the rules were given in memory: no file to reload")
            # compiling 10,000 rules takes seconds: not on the event loop. Both files
            # load before either goes in force: a bad envoy file keeps the old rules.
            ruleset = await asyncio.to_thread(load, engine.path)
            envoy = await asyncio.to_thread(self._load_envoy)
        except ConfigurationError as exc:
            engine.last_error = exc
            self.metrics.reloads.labels("failed").inc()
            self.dashboard.reload_done(str(exc))
            raise
        engine.use(ruleset)
        engine.last_error = None
        for warning in ruleset.warnings:
            log.warning("%s", warning)
        if envoy is not None:
            self.envoy = envoy  # the same limiter names and keys: counters carry on
        self.metrics.reloads.labels("ok").inc()
        self.dashboard.reload_done(None)
        self.metrics.rules.set(len(ruleset))
        log.info("rules reloaded: %d rules", len(ruleset))
        return {"reloaded": True, "rules": len(ruleset), "warnings": list(ruleset.warnings)}

    async def reload_envoy(self) -> None:
        """Load the envoy files again (not the rules); a bad file raises
        `ConfigurationError` and the configuration in force stays."""
        try:
            envoy = await asyncio.to_thread(self._load_envoy)
        except ConfigurationError:
            self.metrics.reloads.labels("failed").inc()
            raise
        self.envoy = envoy
        self.metrics.reloads.labels("ok").inc()
        log.info("envoy config reloaded: domains %s", sorted(envoy.domains) if envoy else [])

    def envoy_watcher(self, interval: float) -> EnvoyWatcher:
        """A watcher reloading the envoy files when they change (`EnvoyWatcher`)."""
        from ..envoy import EnvoyWatcher  # noqa: PLC0415 - only ratewarden serve polls

        return EnvoyWatcher(self, interval)

    async def reset(self, key: str, rule: str | None = None) -> int:
        """Forget ``key`` in every limit (of ``rule``, if named); how many limits."""
        ruleset = self.engine.ruleset
        if rule is not None and rule not in ruleset.by_name:
            domain_paths = {name for name, _ in self._envoy_limiters()}
            if rule not in domain_paths:
                raise NotFound(f"no rule named {rule!r}")
        count = 0
        for spec in ruleset.limits:
            if rule is not None and ruleset.by_limit_name[spec.name].name != rule:
                continue
            # the same name and limit on the same store: the engine's counters
            limiter = AsyncLimiter(
                spec.rate, store=self.store, algorithm=spec.algorithm, burst=spec.burst,
                refill=spec.refill, name=spec.name, on_failure=spec.on_failure,
            )  # fmt: skip
            await limiter.reset(key)
            count += 1
        for path, limiter in self._envoy_limiters():
            if rule is None or rule == path:
                await limiter.reset(key)
                count += 1
        return count

    def _envoy_limiters(self) -> list[tuple[str, AsyncLimiter]]:
        if self.envoy is None:
            return []
        return [(lim.name or "", lim) for lim in self.envoy.limiters]

    async def quota_gauges(self) -> Sequence[QuotaStatus]:
        """The fleet quotas a /metrics scrape exports: none without Redis, and
        none when Redis fails, rather than a failed scrape."""
        if self.quotas is None:
            return ()
        try:
            statuses, _ = await self.quotas.read(MAX_SCRAPED)
        except StoreError as exc:
            log.warning("fleet quota gauges left out of /metrics: %s", exc)
            return ()
        return statuses

    async def ready(self) -> str | None:
        """None when the store answers; else why not."""
        client = getattr(self.store, "client", None)
        if client is None:
            return None  # the memory store is always there
        try:
            await asyncio.wait_for(client.ping(), timeout=1.0)
        except (OSError, TimeoutError, RatewardenError) as exc:
            return f"store unreachable: {exc!r}"
        except Exception as exc:
            return f"store unreachable: {exc!r}"
        return None

    def describe(self) -> dict[str, Any]:
        ruleset = self.engine.ruleset
        rules = [
            {
                "name": r.name,
                "group": r.group,
                "priority": r.priority,
                "action": r.action,
                "by": list(r.by),
                "rates": [str(s.file_rate) for s in r.limits],
                "algorithm": r.limits[0].algorithm,
                "description": r.rule.description,
            }
            for r in ruleset.rules
        ]
        envoy = [] if self.envoy is None else sorted(self.envoy.domains)
        return {
            "source": ruleset.source,
            "domain": self.domain,
            "rules": rules,
            "envoy_domains": envoy,
            "store": type(self.store).__name__,
        }

    # -- adaptive limits -----------------------------------------------------------

    def set_load(self, signal: str, value: object) -> dict[str, Any]:
        """Feed a load signal (``PUT /v1/load/{signal}``): this process's engine
        alone, as the load is this process's (see `ratewarden._adaptive`). What the
        adaptive limits reading it are now; `NotFound` for a signal no rule reads,
        `Unprocessable` for a value that is not a finite number."""
        engine = self.engine
        if signal not in engine.ruleset.signals:
            read = ", ".join(sorted(engine.ruleset.signals)) or "none"
            raise NotFound(
                f"no rule reads the load signal {signal[:100]!r} (the rules read: {read})"
            )
        if type(value) is bool or not isinstance(value, int | float) or not math.isfinite(value):
            raise Unprocessable(f"a load signal's value is a finite number, got {value!r}")
        engine.set_load(signal, float(value))
        readers = {
            spec.name
            for r in engine.ruleset.rules
            if r.rule.adaptive is not None and r.rule.adaptive.signal == signal
            for spec in r.limits
        }
        limits = {
            name: {"limit": full, "effective_limit": effective}
            for name, (full, effective) in engine.effective_limits().items()
            if name in readers
        }
        return {"signal": signal, "value": float(value), "limits": limits, "shared": False}

    # -- runtime overrides -------------------------------------------------------

    @property
    def overrides_shared(self) -> bool:
        """True when overrides live in the store, for every instance on it."""
        source = self.engine.overrides_source
        return source is not None and source.shared

    async def override_list(self) -> OverrideList:
        """The overrides in force and the last 100 changes (`/v1/overrides`)."""
        engine = self.engine
        overrides = await engine.alist_overrides()
        audit = await engine.aoverride_audit(100)
        return OverrideList(overrides, audit, self.overrides_shared)

    async def start(self) -> None:
        """Put the store's overrides in force before the first request and follow
        them; a store that cannot be reached leaves that to the follower."""
        try:
            await self.engine.astart()
        except StoreError as exc:
            log.warning("runtime overrides not read yet: %s", exc)

    async def aclose(self) -> None:
        await self.engine.aclose()
        closer = getattr(self.store, "aclose", None)
        if closer is not None:
            try:
                await closer()
            except StoreError:
                log.warning("closing the store failed", exc_info=True)
