"""Whether the service's store answers: what ``/readyz`` and the dashboard say."""

from __future__ import annotations

import asyncio

from .._errors import RatewardenError
from ..stores import AsyncStore

__all__ = ["store_problem"]


async def store_problem(store: AsyncStore) -> str | None:
    """None when the store answers; else why not."""
    client = getattr(store, "client", None)
    if client is None:
        return None  # the memory store is always there
    try:
        await asyncio.wait_for(client.ping(), timeout=1.0)
    except (OSError, TimeoutError, RatewardenError) as exc:
        return f"store unreachable: {exc!r}"
    except Exception as exc:
        return f"store unreachable: {exc!r}"
    return None
