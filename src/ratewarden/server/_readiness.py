"""Whether the service's store answers: what ``/readyz`` and the dashboard say,
and `StoreHealth`, which logs when the store does not answer at start, stops
answering, or answers again."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Sequence

from ..primitives import RatewardenError
from ..stores import AsyncStore

__all__ = ["StoreHealth", "store_problem"]

log = logging.getLogger("ratewarden.server")


async def store_problem(store: AsyncStore) -> str | None:
    """None when the store answers; else why not."""
    client = getattr(store, "client", None)
    if client is None:
        return None  # the memory store is always there
    try:
        async with asyncio.timeout(1.0):
            await client.ping()
    except (OSError, TimeoutError, RatewardenError) as exc:
        return f"store unreachable: {exc!r}"
    except Exception as exc:
        return f"store unreachable: {exc!r}"
    return None


def policies_said(on_failure: Sequence[str], envoy: bool, concurrency: int = 0) -> str:
    """What answers the checks while the store does not, in a log line's words:
    the rate limits' failure policies (``on_failure``, one a limit), the
    ``concurrency`` rules' refusals (a slot is never granted on a guess)."""
    counted = Counter(on_failure)
    parts = [f"{policy} ({n} limit{'s' if n > 1 else ''})" for policy, n in sorted(counted.items())]
    said = "the rules' on_failure: " + ", ".join(parts) if parts else ""
    if concurrency:
        rules = f"{concurrency} concurrency rule{'s' if concurrency > 1 else ''}"
        said += ("; " if said else "") + f"503 for the requests of {rules}"
    said = said or "no rules"
    if envoy:
        said += "; envoy domains fail open"
    return said


class StoreHealth:
    """Looks at the store every ``interval`` seconds while `run` runs, and logs
    each change: an error when it stops answering (and at `start`, when it does
    not answer then), naming ``where`` (the store's URL) and the failure
    policies that answer the checks meanwhile (``policies()``); a warning when
    it answers again. ``problem`` is the last thing seen (None: it answers).
    ``draining``: the service is stopping, and says so to health checks."""

    def __init__(
        self, store: AsyncStore, where: str, policies: Callable[[], str], interval: float = 1.0
    ) -> None:
        self.store = store
        self.where = where
        self.policies = policies
        self.interval = interval
        self.problem: str | None = None
        self.draining = False

    async def start(self) -> None:
        problem = await store_problem(self.store)
        if problem is not None:
            log.error("store %s does not answer at start (%s): until it does, checks are "
                      "answered by %s; /readyz says 503", self.where, problem,
                      self.policies())  # fmt: skip
        self.problem = problem

    async def look(self) -> None:
        problem = await store_problem(self.store)
        if problem is not None and self.problem is None:
            log.error("store %s stopped answering (%s): until it does, checks are answered "
                      "by %s", self.where, problem, self.policies())  # fmt: skip
        elif problem is None and self.problem is not None:
            log.warning("store %s answers again: checks are counted in it", self.where)
        self.problem = problem

    async def run(self) -> None:
        if getattr(self.store, "client", None) is None:
            return  # the memory store is always there
        while True:
            await asyncio.sleep(self.interval)
            await self.look()

    def __repr__(self) -> str:
        state = "answering" if self.problem is None else self.problem
        return f"<StoreHealth {self.where}: {state}>"
