"""Listing the fleet quotas: the names read from a scan, the limit, and a scan
that fails (Redis itself: tests/cli/test_quota.py)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator

import pytest

from ratewarden import StoreUnavailable
from ratewarden.fleet import alist_quotas, list_quotas

# as a scan hands them out: bytes or text, a resource seen twice
KEYS: list[bytes | str] = [
    b"{rw:quota:b}:cfg", "{rw:quota:a}:cfg", b"{rw:quota:b}:cfg", b"{rw:quota:c}:cfg",
]  # fmt: skip


class ScanClient:
    def __init__(self, keys: list[bytes | str], fails: bool = False) -> None:
        self.keys, self.fails = keys, fails

    def scan_iter(self, *, match: str, count: int) -> Iterator[bytes | str]:
        assert match == "{rw:quota:*}:cfg"
        yield from self.keys
        if self.fails:
            raise ConnectionError("connection reset")


class AsyncScanClient(ScanClient):
    async def scan_iter(self, *, match: str, count: int) -> AsyncIterator[bytes | str]:  # type: ignore[override]
        for key in super().scan_iter(match=match, count=count):
            yield key


@pytest.mark.parametrize(("limit", "names"), [(1000, ["a", "b", "c"]), (2, ["a", "b"]), (1, ["b"])])
def test_the_names_are_sorted_and_cut_at_the_limit(limit: int, names: list[str]) -> None:
    assert list_quotas(ScanClient(KEYS), limit) == names
    assert asyncio.run(alist_quotas(AsyncScanClient(KEYS), limit)) == names


def test_a_failed_scan_is_a_store_unavailable() -> None:
    with pytest.raises(StoreUnavailable, match="cannot list quotas: connection reset"):
        list_quotas(ScanClient(KEYS, fails=True))
    with pytest.raises(StoreUnavailable, match="cannot list quotas: connection reset"):
        asyncio.run(alist_quotas(AsyncScanClient(KEYS, fails=True)))


def test_the_status_as_json_has_no_float_noise() -> None:
    """Thousandths of a permit summed and divided read as the numbers they are."""
    import json  # noqa: PLC0415

    from ratewarden.fleet import MemberStatus, QuotaConfig, QuotaStatus  # noqa: PLC0415

    members = tuple(
        MemberStatus(f"m{i}", wants=has, has=has, used=has * 0.995, expires_in=4.7000000001)
        for i, has in enumerate((33.317, 33.117, 33.117))
    )
    status = QuotaStatus("q", QuotaConfig("100/second"), 100.0, 1, members)
    shown = status.as_dict()
    assert shown["granted"] == shown["wants"] == 99.551
    assert shown["used"] == round(sum(m.used for m in members), 3)
    assert shown["members"][0]["expires_in"] == 4.7
    text = json.dumps(shown)
    assert "99.551," in text
    assert not re.search(r"\d{10}", text), text
