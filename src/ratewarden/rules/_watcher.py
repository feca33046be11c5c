"""`Watcher` and `AsyncWatcher`: reload a rule file when it changes.

Polling, not inotify (watchfiles): one ``stat`` a second is free, it needs no
native dependency, and it sees what inotify setups can miss, such as a
Kubernetes ConfigMap swapping the symlink of a mounted file. A half-written
file fails validation and the old rules stay; the next change reloads.

`Watcher` is an engine's own (a daemon thread, ``engine.try_reload``).
`AsyncWatcher` is a task on an event loop that reloads through its owner's
coroutine: the service's, which also reloads its metrics and dashboard and
serialises the reload with ``/v1/reload`` and SIGHUP. What a poll decides is
written once, in `_FileWatch`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from ..primitives import ConfigurationError

__all__ = ["AsyncWatcher", "Watcher"]

log = logging.getLogger("ratewarden.rules")

_Identity = tuple[int, int, int, int] | None


class _Reloadable(Protocol):
    path: Path | None

    def try_reload(self) -> bool: ...


class _FileWatch:
    """The file's identity (mtime, size, inode, device) as last seen, and the
    counts of reloads that took and that did not."""

    def __init__(self, path: Path | None, interval: float) -> None:
        if path is None:
            raise ConfigurationError("this engine was built from rules in memory: no file")
        if not interval > 0:
            raise ConfigurationError(f"interval must be > 0 seconds, got {interval!r}")
        self.path = path
        self.interval = interval
        self.reloads = 0
        self.failures = 0
        self._seen = _identity(path)

    def _changed(self, now: _Identity) -> bool | None:
        """None when unchanged; False when the file is gone (logged, counted);
        True when it changed and is there to load."""
        if now == self._seen:
            return None
        self._seen = now  # taken before the load: a write during it is seen next time
        if now is None:
            log.error("rule file %s is gone; the previous rules stay in force", self.path)
            self.failures += 1
            return False
        return True

    def _done(self, ok: bool) -> bool:
        if ok:
            self.reloads += 1
        else:
            self.failures += 1
        return ok

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {str(self.path)!r} every {self.interval}s, "
            f"{self.reloads} reloads>"
        )


class Watcher(_FileWatch):
    """Polls the engine's rule file from a daemon thread every ``interval``
    seconds and reloads it when it changes (``engine.try_reload``, which logs a
    file that does not load)."""

    def __init__(self, engine: _Reloadable, interval: float) -> None:
        super().__init__(engine.path, interval)
        self.engine = engine
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ratewarden-rules", daemon=True)

    def poll(self) -> bool | None:
        """Check once: None when the file is unchanged, else whether it reloaded."""
        changed = self._changed(_identity(self.path))
        if not changed:
            return changed
        if self._done(self.engine.try_reload()):
            log.info("rule file %s changed: reloaded", self.path)
            return True
        return False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()


class AsyncWatcher(_FileWatch):
    """Polls ``path`` every ``interval`` seconds as a task (`run`) and awaits
    ``reload`` when it changed; a `ConfigurationError` from it is logged and the
    rules in force stay."""

    def __init__(
        self, path: Path | None, interval: float, reload: Callable[[], Awaitable[object]]
    ) -> None:
        super().__init__(path, interval)
        self._reload = reload

    async def apoll(self) -> bool | None:
        """Look once: None when nothing changed, else whether the reload took."""
        # a stat of a network mount can block: not on the event loop
        changed = self._changed(await asyncio.to_thread(_identity, self.path))
        if not changed:
            return changed
        try:
            await self._reload()
        except ConfigurationError as exc:
            log.error(
                "rule file %s changed but not reloaded, the previous rules stay in force: %s",
                self.path, exc,
            )  # fmt: skip
            return self._done(False)
        log.info("rule file %s changed: reloaded", self.path)
        return self._done(True)

    async def run(self) -> None:
        """Poll until cancelled. A poll that fails otherwise is logged, and the
        next one tries again: a watcher that died quietly would leave edits
        unapplied with nothing said."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.apoll()
            except Exception:
                log.exception("watching rule file %s failed; watching on", self.path)


def _identity(path: Path) -> _Identity:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev
