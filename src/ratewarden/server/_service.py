"""`Service`: what both front ends (HTTP and gRPC) serve, wired together: the
rule engine on the store, the envoy configuration and its statistics, the
metrics, the dashboard's figures and, with Redis, the fleet quota reader.

The service holds these parts and no request logic: the checks are
`_checks`'s, reloading `_reload`'s, the admin operations `_admin`'s and
`_admin_api`'s. Its methods are the ways in that callers outside the front
ends use (tests, an embedding, the file watchers, SIGHUP).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError, StoreError
from ..envoy import EnvoyOptions, EnvoyStats, Override
from ..rules import AsyncRuleEngine, RuleSet
from ..stores import AsyncStore
from . import _admin, _checks, _reload
from ._check_json import check_of, check_result
from ._dashstats import DashboardStats
from ._metrics import Metrics
from ._readiness import StoreHealth, policies_said

if TYPE_CHECKING:
    from ..envoy import EnvoyWatcher
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
        self.store = store
        self.engine = AsyncRuleEngine(rules, store)
        self.reloading = asyncio.Lock()  # one reload at a time, whoever asks (see _reload)
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
            from ._quota_reader import QuotaReader  # noqa: PLC0415 - the redis extra

            self.quotas = QuotaReader(client)
        # logs the store not answering at start, and each change after (see `start`)
        self.health = StoreHealth(store, store_url or repr(store), self._policies)

    # -- checks, for callers that are not a front end -----------------------------

    async def check(self, request: CheckRequest, *, wait: bool = False) -> CheckResult:
        """One check of the HTTP API's shape, answered in it."""
        return check_result(await _checks.decide(self, check_of(request), wait=wait))

    # Every attribute check, from either front end, passes through this method,
    # so that a subclass may wrap them all; it is the checks' own function, so
    # that a check pays no call of the service's for it.
    check_attributes = _checks.check_attributes

    async def check_descriptors(
        self,
        domain: str,
        descriptors: Sequence[Sequence[tuple[str, str]]],
        cost: int = 1,
        overrides: Sequence[Override | None] | None = None,
    ) -> CheckResult:
        """Envoy's descriptors checked, answered as the HTTP API answers them."""
        check = _checks.descriptors_check(
            domain, descriptors, cost, overrides, rules_domain=self.domain
        )
        return check_result(await _checks.decide(self, check))

    # -- configuration ------------------------------------------------------------

    async def reload(self) -> dict[str, Any]:
        """Load the rule file (and envoy files) again; a bad file raises
        `ConfigurationError` and leaves everything in force as it was."""
        return await _reload.reload(self)

    async def reload_envoy(self) -> None:
        """Load the envoy files again (not the rules); a bad file raises
        `ConfigurationError` and the configuration in force stays."""
        await _reload.reload_envoy(self)

    async def reload_rules(self) -> dict[str, Any]:
        """Load the rule file again (not the envoy files); a bad file raises
        `ConfigurationError` and the rules in force stay."""
        return await _reload.reload_rules(self)

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
        them; a store that cannot be reached leaves that to the follower, and is
        logged with the failure policies that answer meanwhile."""
        await self.health.start()
        try:
            await self.engine.astart()
        except StoreError as exc:
            log.warning("runtime overrides not read yet: %s", exc)

    def _policies(self) -> str:
        limits = self.engine.ruleset.limits
        return policies_said([spec.on_failure for spec in limits], self.envoy is not None)

    async def aclose(self) -> None:
        await self.engine.aclose()
        closer = getattr(self.store, "aclose", None)
        if closer is not None:
            try:
                await closer()
            except StoreError:
                log.warning("closing the store failed", exc_info=True)
