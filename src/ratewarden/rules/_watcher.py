"""`Watcher`: reload a rule file when it changes."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Protocol

from .._errors import ConfigurationError

__all__ = ["Watcher"]

log = logging.getLogger("ratewarden.rules")


class _Reloadable(Protocol):
    path: Path | None

    def try_reload(self) -> bool: ...


class Watcher:
    """Polls the rule file's identity (mtime, size, inode) and reloads when it
    changes. Polling, not inotify (watchfiles): one ``stat`` a second is free, it
    needs no native dependency, and it sees what inotify setups can miss, such as a
    Kubernetes ConfigMap swapping the symlink of a mounted file. A half-written
    file fails validation and the old rules stay; the next change reloads."""

    def __init__(self, engine: _Reloadable, interval: float) -> None:
        if engine.path is None:
            raise ConfigurationError("this engine was built from rules in memory: no file")
        if not interval > 0:
            raise ConfigurationError(f"interval must be > 0 seconds, got {interval!r}")
        self.engine = engine
        self.path = engine.path
        self.interval = interval
        self.reloads = 0
        self.failures = 0
        self._seen = _identity(self.path)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ratewarden-rules", daemon=True)

    def poll(self) -> bool | None:
        """Check once: None when the file is unchanged, else whether it reloaded."""
        now = _identity(self.path)
        if now == self._seen:
            return None
        self._seen = now
        if now is None:
            log.error("rule file %s is gone; the previous rules stay in force", self.path)
            self.failures += 1
            return False
        if self.engine.try_reload():
            self.reloads += 1
            return True
        self.failures += 1
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

    def __repr__(self) -> str:
        return f"<Watcher {str(self.path)!r} every {self.interval}s, {self.reloads} reloads>"


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev
