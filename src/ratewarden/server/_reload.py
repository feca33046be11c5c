"""Loading the service's configuration again while it serves: the rule file and
the envoy files (``POST /v1/reload``, SIGHUP), the rule file alone (the
``--config`` watcher), or the envoy files alone (the ``--envoy-config``
watcher). A bad file raises `ConfigurationError` and leaves everything in force
as it was. One reload at a time (``service.reloading``): an older, slower load
must not put its rules in force after a newer one did.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError
from ..envoy import AsyncEnvoyConfig, envoy_files
from ..rules import load

if TYPE_CHECKING:
    from ._service import Service

__all__ = ["load_envoy", "reload", "reload_envoy", "reload_rules"]

log = logging.getLogger("ratewarden.server")


def load_envoy(service: Service) -> AsyncEnvoyConfig | None:
    """The service's envoy files as they are now (None without any); files a
    directory holds that are not YAML are logged, never silently passed over."""
    if not service.envoy_files:
        return None
    found = envoy_files(service.envoy_files)
    for path in found.ignored:
        log.warning("envoy config: %s is not a .yaml/.yml file: not loaded", path)
    o = service.envoy_options
    return AsyncEnvoyConfig.load(
        *found.files, store=service.store, merge=o.merge, count_denied=o.count_denied,
        shadow_mode=o.shadow_mode, quota_mode=o.quota_mode, stats=service.envoy_stats,
    )  # fmt: skip


async def reload(service: Service) -> dict[str, Any]:
    """Load the rule file and the envoy files again; what ``/v1/reload`` answers.
    Rules given in memory (``serve`` without ``--config``) have no file: then
    the envoy files alone, and with none of those either there is nothing to do."""
    async with service.reloading:
        return await _reload(service, envoy=bool(service.envoy_files))


async def reload_rules(service: Service) -> dict[str, Any]:
    """Load the rule file again, not the envoy files (they have a watcher of
    their own, and a bad one must not hold back an edit of the rules)."""
    async with service.reloading:
        return await _reload(service, envoy=False)


async def _reload(service: Service, *, envoy: bool) -> dict[str, Any]:
    engine = service.engine
    path = engine.path
    try:
        if path is None and not envoy:
            raise ConfigurationError(
                "the rules were given in memory: no file to reload"
                + ("" if service.envoy_files else ", and no envoy config (--envoy-config)")
            )
        # compiling 10,000 rules takes seconds: not on the event loop. Both files
        # load before either goes in force: a bad envoy file keeps the old rules.
        ruleset = None if path is None else await asyncio.to_thread(load, path)
        envoy_config = await asyncio.to_thread(load_envoy, service) if envoy else None
    except ConfigurationError as exc:
        engine.last_error = exc
        service.metrics.reloads.labels("failed").inc()
        service.dashboard.reload_done(str(exc))
        raise
    loaded = []
    if ruleset is not None:
        engine.use(ruleset)
        engine.last_error = None
        for warning in ruleset.warnings:
            log.warning("%s", warning)
        service.metrics.rules.set(len(ruleset))
        loaded.append("rules")
        log.info("rules reloaded: %d rules", len(ruleset))
    if envoy_config is not None:
        service.envoy = envoy_config  # the same limiter names and keys: counters carry on
        loaded.append("envoy")
        log.info("envoy config reloaded: domains %s", sorted(envoy_config.domains))
    service.metrics.reloads.labels("ok").inc()
    service.dashboard.reload_done(None)
    answer: dict[str, Any] = {
        "reloaded": True,
        "loaded": loaded,
        "rules": len(engine.ruleset),
        "warnings": [] if ruleset is None else list(ruleset.warnings),
    }
    if envoy_config is not None:
        answer["envoy_domains"] = sorted(envoy_config.domains)
    return answer


async def reload_envoy(service: Service) -> None:
    """Load the envoy files again, not the rules."""
    async with service.reloading:
        try:
            envoy = await asyncio.to_thread(load_envoy, service)
        except ConfigurationError:
            service.metrics.reloads.labels("failed").inc()
            raise
        service.envoy = envoy
    service.metrics.reloads.labels("ok").inc()
    log.info("envoy config reloaded: domains %s", sorted(envoy.domains) if envoy else [])
