"""Operating fleet quotas: create or change a resource, read its state, list them.

What ``ratewarden quota`` and the service's ``/v1/quotas`` call. A change of the
total reaches every member within one refresh, and at once through the
resource's channel; a cut scales every member's holding down in the same script
call, so the coordinator never counts more than the new total as held.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import partial
from typing import Any

from ..primitives import Call, Flow, StoreUnavailable, adrive, drive
from .config import QuotaConfig
from .coordinator import AsyncCoordinator, Coordinator, QuotaStatus

__all__ = ["alist_quotas", "ashow_quota", "list_quotas", "set_quota", "show_quota"]

_PATTERN = "{rw:quota:*}:cfg"


def set_quota(client: Any, name: str, config: QuotaConfig) -> int:
    """Create resource ``name`` or replace its configuration; its new version."""
    return Coordinator(client, name).set(config)


def show_quota(client: Any, name: str) -> QuotaStatus | None:
    """The resource, its members and their figures; None if it does not exist."""
    return Coordinator(client, name).show()


async def ashow_quota(client: Any, name: str) -> QuotaStatus | None:
    return await AsyncCoordinator(client, name).show()


def _name(key: Any) -> str:
    text = key.decode() if isinstance(key, bytes) else str(key)
    return text[len("{rw:quota:") : -len("}:cfg")]


def _names(next_key: Call, limit: int) -> Flow[list[str]]:
    """The names of the resources whose keys ``next_key`` gives one at a time
    (None: no more), until ``limit`` of them, sorted."""
    names = set()
    while (key := (yield next_key)) is not None:
        names.add(_name(key))
        if len(names) >= limit:
            break
    return sorted(names)


@contextlib.contextmanager
def _listing() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        raise StoreUnavailable(f"redis: cannot list quotas: {exc}") from exc


def list_quotas(client: Any, limit: int = 1000) -> list[str]:
    """The names of the resources in Redis (at most ``limit``), sorted."""
    with _listing():
        keys = client.scan_iter(match=_PATTERN, count=500)
        return drive(_names(partial(next, keys, None), limit))


async def alist_quotas(client: Any, limit: int = 1000) -> list[str]:
    """The asyncio twin of `list_quotas`."""
    with _listing():
        keys = client.scan_iter(match=_PATTERN, count=500)
        return await adrive(_names(partial(anext, keys, None), limit))
