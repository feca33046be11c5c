"""The rules the service answers by, and the ways they change while it serves.

`RulesInForce` holds the YAML rules' engine on the store, the envoy files'
configuration, the rules' own domain and their Envoy quota buckets (``rlqs``).
It reloads the rule file and the envoy files (``POST /v1/reload``, SIGHUP), the rule file alone (the
``--config`` watcher) or the envoy files alone (the ``--envoy-config``
watcher): a bad file raises `ConfigurationError` and leaves everything in force
as it was, and one reload runs at a time, so that an older, slower load never
puts its rules in force after a newer one did. It also says what is in force
(``GET /v1/rules``) and forgets a key in it (``DELETE /v1/keys/{key}``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..envoy import AsyncEnvoyConfig, EnvoyOptions, envoy_files
from ..primitives import ConfigurationError
from ..rlqs import LocalCoordinators, QuotaService, RedisCoordinators, bucket_rules
from ..rules import AsyncRuleEngine, RuleSet, UnknownRule, load
from ..stores import AsyncStore
from ._counters import Counters
from ._refusals import NotFound

__all__ = ["RulesInForce"]

log = logging.getLogger("ratewarden.server")


class RulesInForce:
    """The YAML rules (``rules``: a file, or a `RuleSet`) on ``store``, the
    envoy files' domains, and ``domain``, whose descriptors the YAML rules
    decide. Reloads are counted in ``counters``."""

    def __init__(
        self,
        rules: str | os.PathLike[str] | RuleSet,
        store: AsyncStore,
        counters: Counters,
        *,
        envoy_files: Sequence[str | os.PathLike[str]] = (),
        envoy_options: EnvoyOptions | None = None,
        domain: str = "ratewarden",
    ) -> None:
        self.store = store
        self.engine = AsyncRuleEngine(rules, store)
        # the key of the settle tokens (`_settle_api`): shared by the instances and
        # the workers that are given it, so that one can settle another's token
        shared = os.environ.get("RATEWARDEN_SETTLE_SECRET")
        if shared:
            self.engine.settles.secret = hashlib.sha256(shared.encode()).digest()
        # Envoy's quota buckets: coordinated in the store's Redis when there is
        # one (instances share them), else in this process
        client = getattr(store, "client", None)
        coordinators = LocalCoordinators() if client is None else RedisCoordinators(client)
        self.quotas = QuotaService(bucket_rules(self.engine.ruleset.file.rlqs), coordinators)
        self.envoy_files = tuple(Path(p) for p in envoy_files)
        self.envoy_options = EnvoyOptions() if envoy_options is None else envoy_options
        self._counters = counters
        self._reloading = asyncio.Lock()
        self.envoy = self._load_envoy()
        if self.envoy is not None and domain in self.envoy.domains:
            raise ConfigurationError(
                f"domain {domain!r} is both the rules' domain and in an envoy config file;"
                " pick another --domain"
            )
        self.domain = domain
        counters.metrics.rules.set(len(self.engine.ruleset))

    @property
    def reloading(self) -> asyncio.Lock:
        """Held while a reload runs."""
        return self._reloading

    def _load_envoy(self) -> AsyncEnvoyConfig | None:
        """The envoy files as they are now (None without any); files a directory
        holds that are not YAML are logged, never silently passed over."""
        if not self.envoy_files:
            return None
        found = envoy_files(self.envoy_files)
        for path in found.ignored:
            log.warning("envoy config: %s is not a .yaml/.yml file: not loaded", path)
        o = self.envoy_options
        return AsyncEnvoyConfig.load(
            *found.files, store=self.store, merge=o.merge, count_denied=o.count_denied,
            shadow_mode=o.shadow_mode, quota_mode=o.quota_mode, stats=self._counters.envoy_stats,
        )  # fmt: skip

    # -- reloading ----------------------------------------------------------------------

    async def reload(self) -> dict[str, Any]:
        """Load the rule file and the envoy files again; what ``/v1/reload``
        answers. Rules given in memory (``serve`` without ``--config``) have no
        file: then the envoy files alone, and with none of those either there is
        nothing to do."""
        async with self._reloading:
            return await self._reload(envoy=bool(self.envoy_files))

    async def reload_rules(self) -> dict[str, Any]:
        """Load the rule file again, not the envoy files (they have a watcher of
        their own, and a bad one must not hold back an edit of the rules)."""
        async with self._reloading:
            return await self._reload(envoy=False)

    async def _reload(self, *, envoy: bool) -> dict[str, Any]:
        engine = self.engine
        path = engine.path
        try:
            if path is None and not envoy:
                raise ConfigurationError(
                    "the rules were given in memory: no file to reload"
                    + ("" if self.envoy_files else ", and no envoy config (--envoy-config)")
                )
            # compiling 10,000 rules takes seconds: not on the event loop. Both files
            # load before either goes in force: a bad envoy file keeps the old rules.
            ruleset = None if path is None else await asyncio.to_thread(load, path)
            buckets = None if ruleset is None else bucket_rules(ruleset.file.rlqs)
            envoy_config = await asyncio.to_thread(self._load_envoy) if envoy else None
        except ConfigurationError as exc:
            engine.last_error = exc
            self._counters.reload_failed(str(exc))
            raise
        loaded = []
        if ruleset is not None:
            engine.use(ruleset)
            engine.last_error = None
            if buckets is not None:
                await self.quotas.use(buckets)
            for warning in ruleset.warnings:
                log.warning("%s", warning)
            loaded.append("rules")
            log.info("rules reloaded: %d rules", len(ruleset))
        if envoy_config is not None:
            self.envoy = envoy_config  # the same limiter names and keys: counters carry on
            loaded.append("envoy")
            log.info("envoy config reloaded: domains %s", sorted(envoy_config.domains))
        self._counters.reloaded(None if ruleset is None else len(ruleset))
        answer: dict[str, Any] = {
            "reloaded": True,
            "loaded": loaded,
            "rules": len(engine.ruleset),
            "warnings": [] if ruleset is None else list(ruleset.warnings),
        }
        if envoy_config is not None:
            answer["envoy_domains"] = sorted(envoy_config.domains)
        return answer

    async def reload_envoy(self) -> None:
        """Load the envoy files again, not the rules."""
        async with self._reloading:
            try:
                envoy = await asyncio.to_thread(self._load_envoy)
            except ConfigurationError as exc:
                self._counters.reload_failed(str(exc), shown=False)
                raise
            self.envoy = envoy
        self._counters.reloaded(None, shown=False)
        log.info("envoy config reloaded: domains %s", sorted(envoy.domains) if envoy else [])

    # -- what the admin endpoints see ---------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """The rules in force, as ``GET /v1/rules`` shows them."""
        ruleset = self.engine.ruleset
        rules = [
            {
                "name": r.name,
                "group": r.group,
                "priority": r.priority,
                "action": r.action,
                "by": list(r.by),
                "rates": [str(s.file_rate) for s in r.limits],
                "algorithm": r.limits[0].algorithm if r.limits else None,
                "concurrency": r.concurrency,
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

    async def reset(self, key: str, rule: str | None = None) -> int:
        """Forget ``key`` in every limit in force (of ``rule``: a YAML rule's
        name or an envoy limit's path, if given); how many limits. The engine's
        own limiters forget it, so an override's limit, an adaptive one, shards
        and a two-tier count forget it too; `NotFound` for a rule nobody names."""
        envoy = self.envoy
        paths = [] if envoy is None else [(lim.name or "", lim) for lim in envoy.limiters]
        count = 0
        if rule is None or rule in self.engine.ruleset.by_name:
            try:
                count = await self.engine.areset(key, rule)
            except UnknownRule:  # a reload took it away meanwhile
                raise NotFound(f"no rule named {rule!r}") from None
        elif all(rule != path for path, _ in paths):
            raise NotFound(f"no rule named {rule!r}")
        for path, limiter in paths:
            if rule is None or rule == path:
                await limiter.reset(key)
                count += 1
        return count
