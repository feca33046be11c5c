"""Reloading the envoy configuration when its files change, as envoyproxy/
ratelimit watches its runtime directory: every ``interval`` seconds the files'
`fingerprint` is taken (names, and through symlinks their identity, size and
time), and a change loads them all again. A bad file is logged and counted,
and the configuration in force stays, as for a reload by hand.

Polling, not inotify: it needs no native dependency, costs a few ``stat`` calls
a second, and sees a Kubernetes ConfigMap's ``..data`` symlink swap, which
changes no watched name.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from .._errors import ConfigurationError
from ..rules._envoydir import fingerprint

if TYPE_CHECKING:
    from ._service import Service

__all__ = ["EnvoyWatcher"]

log = logging.getLogger("ratewarden.server")


class EnvoyWatcher:
    def __init__(self, service: Service, interval: float) -> None:
        if not interval > 0:
            raise ConfigurationError(f"interval must be > 0 seconds, got {interval!r}")
        self.service = service
        self.interval = interval
        self.reloads = 0
        self.failures = 0
        self._seen = fingerprint(service.envoy_files)

    async def apoll(self) -> bool | None:
        """Look once: None when nothing changed, else whether the reload took."""
        now = await asyncio.to_thread(fingerprint, self.service.envoy_files)
        if now == self._seen:
            return None
        self._seen = now
        try:
            await self.service.reload_envoy()
        except ConfigurationError as exc:
            self.failures += 1
            log.error("envoy config changed but not reloaded, the previous stays: %s", exc)
            return False
        self.reloads += 1
        return True

    async def run(self) -> None:
        """Poll until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            await self.apoll()

    def __repr__(self) -> str:
        return f"<EnvoyWatcher every {self.interval}s, {self.reloads} reloads>"
