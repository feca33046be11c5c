"""The rule file's ``rlqs`` section compiled: which Envoy buckets share which
total, and the fleet quota each bucket id becomes.

    rlqs:
      - name: api-per-tenant
        domain: envoy
        bucket: {name: api, tenant: "*"}
        rate: 200/second
        algorithm: fair_share

A bucket id Envoy reports matches an entry when it holds each of ``bucket``'s
keys with that value (``*``: any value), under the entry's ``domain``; the first
entry in file order that matches decides. Every distinct bucket id is a quota of
its own: with ``tenant: "*"``, each tenant has 200/second across the proxies.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..fleet.config import QuotaConfig
from ..primitives import ConfigurationError

__all__ = ["BucketKey", "BucketRule", "bucket_key", "bucket_rules", "match", "resource_name"]

# a bucket id as one hashable value: its entries sorted by key (Envoy says the
# order of a BucketId's entries does not matter)
BucketKey = tuple[tuple[str, str], ...]

_SAFE = re.compile(r"[A-Za-z0-9._-]+")
_UNSAFE = re.compile(r"[^A-Za-z0-9._:-]")
_ALGORITHMS = ("equal", "proportional_share", "fair_share")


@dataclass(frozen=True, slots=True)
class BucketRule:
    """One ``rlqs`` entry: the buckets it matches and the quota each one gets."""

    name: str
    domain: str
    pattern: BucketKey
    quota: QuotaConfig
    abandon_after: float  # seconds of no requests before a proxy is told to forget a bucket
    # the quota as the coordinator keeps it: what a refresh creates a missing
    # resource from, and what a stored one is compared with, once per entry
    fields: dict[str, str]

    def matches(self, domain: str, bucket: Mapping[str, str]) -> bool:
        if domain != self.domain:
            return False
        for key, value in self.pattern:
            got = bucket.get(key)
            if got is None or value not in ("*", got):
                return False
        return True

    @property
    def ttl(self) -> int:
        """An assignment's time to live, in whole seconds (Envoy 1.40 reads no
        fraction of it): shorter than the lease, so that a proxy that lost its
        stream stops spending a share before the coordinator gives that share
        to the others."""
        return max(1, math.floor(self.quota.lease * 0.8))


def bucket_key(bucket: Mapping[str, str]) -> BucketKey:
    return tuple(sorted(bucket.items()))


def resource_name(domain: str, key: BucketKey) -> str:
    """The fleet resource of a bucket id: readable where the id's text allows
    (``rlqs/envoy/name:api/tenant:acme``), else with a digest in place of the
    parts a resource name cannot hold; a digest of the whole keeps two ids
    apart that read alike."""
    if all(_SAFE.fullmatch(text) for text in (domain, *(x for pair in key for x in pair))):
        name = "rlqs/" + "/".join([domain, *(f"{k}:{v}" for k, v in key)])
        if len(name) <= 200:
            return name
    digest = hashlib.sha256(repr((domain, key)).encode()).hexdigest()[:24]
    readable = "/".join(_UNSAFE.sub("_", p) for p in [domain, *(f"{k}:{v}" for k, v in key)])
    return f"rlqs/{readable[:150]}/{digest}"


def _rule(i: int, entry: Any) -> BucketRule:
    where = f"rlqs[{i}] ({entry.name})"
    lease = float(entry.lease)
    try:
        # refresh: how long the coordinator holds the others to what they hold
        # after a member's lease lapses (two refreshes); a proxy stops spending a
        # lapsed share before that (its assignment's ttl), so that wait is short
        quota = QuotaConfig(entry.rate, entry.algorithm, refresh=lease / 20, lease=lease)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None
    if quota.algorithm not in _ALGORITHMS:
        raise ConfigurationError(
            f"{where}: algorithm must be one of {', '.join(_ALGORITHMS)}, got {quota.algorithm!r}"
        )
    if entry.abandon_after < lease:
        raise ConfigurationError(
            f"{where}: abandon_after ({entry.abandon_after} s) must be at least the lease"
            f" ({lease} s)"
        )
    return BucketRule(
        entry.name, entry.domain, bucket_key(entry.bucket), quota, float(entry.abandon_after),
        quota.fields(),
    )  # fmt: skip


def bucket_rules(entries: Iterable[Any]) -> tuple[BucketRule, ...]:
    """The rule file's ``rlqs`` entries (`rules.RlqsBucket`) compiled; a
    `ConfigurationError` names the entry at fault."""
    return tuple(_rule(i, entry) for i, entry in enumerate(entries))


def match(rules: Iterable[BucketRule], domain: str, bucket: Mapping[str, str]) -> BucketRule | None:
    for rule in rules:
        if rule.matches(domain, bucket):
            return rule
    return None
