# Generated from src/ratewarden/fleet/_acoordinator.py by scripts/unasync.py:
# edit that file, then run the script.
"""`Coordinator`: sends ``fleet.lua``'s calls to Redis.

What each call sends and what its reply means is `_coordinator_calls`'s; this
only sends them: by the script's digest, and with its source when Redis has
lost it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError, RedisError

from ._coordinator_calls import (
    CoordinatorBase,
    QuotaStatus,
    Reply,
    Report,
    failure,
    parse_refresh,
    parse_set,
    parse_show,
    refresh_args,
    set_args,
    source,
)
from .alloc import Piece
from .config import QuotaConfig

__all__ = ["Coordinator"]


class Coordinator(CoordinatorBase):
    """The coordinator of resource ``name`` through a ``redis.Redis`` client
    (or cluster client); a `Clock` only for tests and simulations."""

    def _call(self, op: str, rest: list[Any]) -> Any:
        args = self._args(op, rest)
        try:
            try:
                return self.client.evalsha(self._sha, 2, *args)
            except NoScriptError:
                return self.client.eval(source(), 2, *args)
        except (RedisError, OSError) as exc:
            raise failure(exc) from exc

    def report(self, member: str, report: Report) -> Reply | None:
        """Send ``member``'s report and receive its grant; None when the resource
        does not exist and the report carries no configuration to create it."""
        return parse_refresh(self._call("refresh", refresh_args(member, report)))

    def refresh(
        self,
        member: str,
        *,
        wants: int,
        has: int,
        used: int,
        throttled: int = 0,
        pieces: Sequence[Piece] = (),
        restore: dict[str, str] | None = None,
        paced: bool = False,
    ) -> Reply | None:
        """`report` with the report's figures as keywords (see `Report`)."""
        figures = Report(wants, has, used, throttled, tuple(pieces), restore, paced)
        return self.report(member, figures)

    def set(self, config: QuotaConfig) -> int:
        """Create or change the resource; its new version."""
        return parse_set(self._call("set", set_args(config)))

    def show(self) -> QuotaStatus | None:
        """The resource, its members and their figures; None if it does not exist."""
        return parse_show(self.name, self._call("show", []))

    def leave(self, member: str) -> None:
        """Take ``member`` out at once: its share is free for the others."""
        self._call("leave", [member])
