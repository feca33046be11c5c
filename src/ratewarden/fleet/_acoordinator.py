"""`AsyncCoordinator`: sends ``fleet.lua``'s calls to Redis.

What each call sends and what its reply means is `_coordinator_calls`'s; this
only sends them: by the script's digest, and with its source when Redis has
lost it.
"""

# unasync: twin _coordinator.py
# unasync: rename redis.asyncio.Redis -> redis.Redis

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

__all__ = ["AsyncCoordinator"]


class AsyncCoordinator(CoordinatorBase):
    """The coordinator of resource ``name`` through a ``redis.asyncio.Redis`` client
    (or cluster client); a `Clock` only for tests and simulations."""

    async def _call(self, op: str, rest: list[Any]) -> Any:
        args = self._args(op, rest)
        try:
            try:
                return await self.client.evalsha(self._sha, 2, *args)
            except NoScriptError:
                return await self.client.eval(source(), 2, *args)
        except (RedisError, OSError) as exc:
            raise failure(exc) from exc

    async def report(self, member: str, report: Report) -> Reply | None:
        """Send ``member``'s report and receive its grant; None when the resource
        does not exist and the report carries no configuration to create it."""
        return parse_refresh(await self._call("refresh", refresh_args(member, report)))

    async def refresh(
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
        return await self.report(member, figures)

    async def set(self, config: QuotaConfig) -> int:
        """Create or change the resource; its new version."""
        return parse_set(await self._call("set", set_args(config)))

    async def show(self) -> QuotaStatus | None:
        """The resource, its members and their figures; None if it does not exist."""
        return parse_show(self.name, await self._call("show", []))

    async def leave(self, member: str) -> None:
        """Take ``member`` out at once: its share is free for the others."""
        await self._call("leave", [member])
