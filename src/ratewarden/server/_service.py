"""`Service`: what both front ends (HTTP and gRPC) serve, wired together: the
rule engine on the store, the envoy configuration and its statistics, the
metrics, the dashboard's figures and, with Redis, the fleet quota reader.

Reloading is `_reload`'s, the admin operations `_admin`'s and `_admin_api`'s.
Each check is one engine call.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError, StoreError
from ..envoy import EnvoyOptions
from ..rules import (
    AsyncRuleEngine,
    EnvoyResult,
    EnvoyStats,
    Outcome,
    Override,
    RuleSet,
)
from ..stores import AsyncStore
from . import _admin, _reload
from ._dashstats import DashboardStats
from ._metrics import Metrics
from ._refusals import InvalidRequest, Unprocessable
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
        self.envoy = _reload.load_envoy(self)
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

    # -- configuration ------------------------------------------------------------

    async def reload(self) -> dict[str, Any]:
        """Load the rule file (and envoy files) again; a bad file raises
        `ConfigurationError` and leaves everything in force as it was."""
        return await _reload.reload(self)

    async def reload_envoy(self) -> None:
        """Load the envoy files again (not the rules); a bad file raises
        `ConfigurationError` and the configuration in force stays."""
        await _reload.reload_envoy(self)

    def envoy_watcher(self, interval: float) -> EnvoyWatcher:
        """A watcher reloading the envoy files when they change (`EnvoyWatcher`)."""
        from ..envoy import EnvoyWatcher  # noqa: PLC0415 - only ratewarden serve polls

        return EnvoyWatcher(self, interval)

    def describe(self) -> dict[str, Any]:
        """The rules in force, as ``GET /v1/rules`` shows them."""
        return _admin.describe(self)

    # -- the lifetime -------------------------------------------------------------

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
