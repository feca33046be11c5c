"""`Service`: what both front ends (HTTP and gRPC) serve, put together from
parts, each given only what it needs:

- `RulesInForce`: the rule engine on the store, the envoy configuration, the
  rules' domain, and reloading them;
- `Counters`: the metrics, the dashboard's figures and envoy's statistics;
- `Checker`: a typed check in, a counted verdict out (the front ends' part);
- `StoreHealth`: whether the store answers, and whether the service drains;
- with Redis, a `QuotaReader` of the fleet quotas in it.

The service holds the parts and no request logic. Its methods are the ways in
for callers outside the front ends (tests, an embedding, the file watchers,
SIGHUP); the front ends take the parts they use from it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..envoy import AsyncEnvoyConfig, EnvoyOptions, EnvoyStats, Override
from ..primitives import StoreError
from ..rules import AsyncRuleEngine, RuleSet
from ..stores import AsyncStore
from ._check_json import check_of, check_result
from ._checker import Checker, descriptors_check
from ._counters import Counters
from ._dashstats import DashboardStats
from ._metrics import Metrics
from ._readiness import StoreHealth, policies_said
from ._rules_in_force import RulesInForce

if TYPE_CHECKING:
    from ..envoy import EnvoyWatcher
    from ..rlqs import Stats
    from ..rules import Outcome
    from ._local_quotas import LocalQuotas
    from ._quota_reader import QuotaReader
    from ._shapes import CheckRequest, CheckResult

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
        store_url: str | None = None,
    ) -> None:
        options = EnvoyOptions() if envoy_options is None else envoy_options
        self.store = store
        # one set of counters for the process: a reload keeps them counting
        self.counters = Counters(
            near_limit_ratio=options.near_limit_ratio, quota_members=quota_member_metrics
        )
        self.rules = RulesInForce(
            rules, store, self.counters, envoy_files=envoy_files, envoy_options=options,
            domain=domain,
        )  # fmt: skip
        self.checker = Checker(self.rules, self.counters)
        engine = self.rules.engine
        self.counters.metrics.adaptive.limits = engine.effective_limits
        self.counters.metrics.adaptive.signals = engine.signals.values
        self.counters.metrics.quota_streams.stats = self._quota_stream_stats
        self.counters.metrics.holds.in_flight = engine.holds.in_flight
        self.counters.metrics.holds.stats = lambda: engine.holds.stats
        self.quotas: QuotaReader | None = None
        client = getattr(store, "client", None)  # a Redis store's (the memory store has none)
        if client is not None:
            from ._quota_reader import QuotaReader  # noqa: PLC0415 - the redis extra

            self.quotas = QuotaReader(client)
        # logs the store not answering at start, and each change after (see `start`)
        self.health = StoreHealth(store, store_url or repr(store), self._policies)

    def _quota_stream_stats(self) -> Stats | None:
        """The quota streams' figures while the rules have an ``rlqs`` section
        or a stream is open; else none, and no series for them."""
        quotas = self.rules.quotas
        return quotas.stats if quotas.rules or quotas.stats.streams else None

    def quota_source(self) -> QuotaReader | LocalQuotas | None:
        """Where ``/v1/quotas`` and the quota gauges read: the fleet quotas in
        Redis; on the memory store, the Envoy quota buckets coordinated here
        while the rules have an ``rlqs`` section; else none."""
        if self.quotas is not None:
            return self.quotas
        if self.rules.quotas.rules:
            from ._local_quotas import LocalQuotas  # noqa: PLC0415 - with rlqs entries only

            return LocalQuotas(self.rules.quotas)
        return None

    # -- the parts' figures, by the names callers know ------------------------------

    @property
    def engine(self) -> AsyncRuleEngine:
        return self.rules.engine

    @property
    def envoy(self) -> AsyncEnvoyConfig | None:
        return self.rules.envoy

    @property
    def domain(self) -> str:
        return self.rules.domain

    @property
    def envoy_options(self) -> EnvoyOptions:
        return self.rules.envoy_options

    @property
    def metrics(self) -> Metrics:
        return self.counters.metrics

    @property
    def dashboard(self) -> DashboardStats:
        return self.counters.dashboard

    @property
    def envoy_stats(self) -> EnvoyStats:
        return self.counters.envoy_stats

    @property
    def draining(self) -> bool:
        """Whether the service drains: /healthz and /readyz say 503."""
        return self.health.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.health.draining = value

    # -- checks, for callers that are not a front end -----------------------------

    async def check(self, request: CheckRequest, *, wait: bool = False) -> CheckResult:
        """One check of the HTTP API's shape, answered in it."""
        return check_result(await self.checker.decide(check_of(request), wait=wait))

    async def check_attributes(
        self, attributes: Any, cost: int = 1, *, wait: bool = False
    ) -> Outcome:
        """The YAML rules' answer to ``attributes``, counted."""
        return await self.checker.check_attributes(attributes, cost, wait=wait)

    async def check_descriptors(
        self,
        domain: str,
        descriptors: Sequence[Sequence[tuple[str, str]]],
        cost: int = 1,
        overrides: Sequence[Override | None] | None = None,
    ) -> CheckResult:
        """Envoy's descriptors checked, answered as the HTTP API answers them."""
        check = descriptors_check(domain, descriptors, cost, overrides, rules_domain=self.domain)
        return check_result(await self.checker.decide(check))

    # -- configuration ------------------------------------------------------------

    async def reload(self) -> dict[str, Any]:
        """Load the rule file (and envoy files) again; a bad file raises
        `ConfigurationError` and leaves everything in force as it was."""
        return await self.rules.reload()

    async def reload_envoy(self) -> None:
        """Load the envoy files again (not the rules); a bad file raises
        `ConfigurationError` and the configuration in force stays."""
        await self.rules.reload_envoy()

    async def reload_rules(self) -> dict[str, Any]:
        """Load the rule file again (not the envoy files); a bad file raises
        `ConfigurationError` and the rules in force stay."""
        return await self.rules.reload_rules()

    def envoy_watcher(self, interval: float) -> EnvoyWatcher:
        """A watcher reloading the envoy files when they change (`EnvoyWatcher`)."""
        from ..envoy import EnvoyWatcher  # noqa: PLC0415 - only ratewarden serve polls

        return EnvoyWatcher(self.rules, interval)

    def describe(self) -> dict[str, Any]:
        """The rules in force, as ``GET /v1/rules`` shows them."""
        return self.rules.describe()

    async def reset(self, key: str, rule: str | None = None) -> int:
        """Forget ``key`` in every limit in force (of ``rule``, if named)."""
        return await self.rules.reset(key, rule)

    # -- the lifetime -------------------------------------------------------------

    async def start(self) -> None:
        """Put the store's overrides in force before the first request and follow
        them; a store that cannot be reached leaves that to the follower, and is
        logged with the failure policies that answer meanwhile."""
        await self.health.start()
        try:
            await self.engine.astart()
        except StoreError as exc:
            log.warning("runtime overrides not read yet: %s", exc)

    def _policies(self) -> str:
        ruleset = self.engine.ruleset
        on_failure = [spec.on_failure for spec in ruleset.limits]
        return policies_said(on_failure, self.envoy is not None, len(ruleset.concurrent))

    async def aclose(self) -> None:
        await self.engine.aclose()
        closer = getattr(self.store, "aclose", None)
        if closer is not None:
            try:
                await closer()
            except StoreError:
                log.warning("closing the store failed", exc_info=True)
