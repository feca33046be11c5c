"""An envoyproxy/ratelimit configuration as a tree per domain, and the lookup
that finds a descriptor's limit in it, with that service's semantics.

Lookup, entry by entry down the tree, takes at every level: the node with the
entry's key and exact value, else the first wildcard node (in file order) whose
pattern matches the value (``*`` anywhere, any number of times, each matching
any run of characters, none included), else the node with the key and no value.
A descriptor gets the limit of the node its LAST entry lands on, so a
descriptor longer or shorter than the configured nesting gets no limit.

The lookup also says how that service names the limit in its statistics (the
config path, or with ``detailed_metric`` the request's own values, or with
``value_to_metric`` the values of the levels that ask for it) and which entries'
values a ``share_threshold`` wildcard replaces by its pattern in the counter key,
so every value matching it shares one counter.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..primitives import UNIT_SECONDS
from ..rules.source import Document, Problem, RuleFileError
from ._files import EnvoyDescriptor, EnvoyFile

__all__ = ["Level", "LimitSpec", "Match", "Node", "build", "lookup", "wildcard_match"]

_UNITS = tuple(UNIT_SECONDS)  # second ... year, as that service names them (any case)
MAX_REQUESTS_PER_UNIT = 2**32 - 1  # a uint32 there


@dataclass(frozen=True, slots=True)
class LimitSpec:
    """A node's ``rate_limit``: ``requests_per_unit`` per ``unit`` (``period``
    seconds); ``unlimited`` ones are never counted."""

    requests_per_unit: int
    unit: str
    period: int
    unlimited: bool
    name: str | None
    replaces: frozenset[str]
    shadow: bool
    quota: bool
    detailed: bool
    metadata: dict[str, object] | None


@dataclass(slots=True)
class Level:
    exact: dict[tuple[str, str], Node] = field(default_factory=dict)
    # per key, the wildcard nodes in file order: (pattern split on "*", node)
    wildcards: dict[str, list[tuple[tuple[str, ...], Node]]] = field(default_factory=dict)
    patterns: set[tuple[str, str]] = field(default_factory=set)  # (key, pattern) taken
    any_value: dict[str, Node] = field(default_factory=dict)
    size: int = 0


@dataclass(eq=False, slots=True)
class Node:
    key: str
    value: str | None
    path: str  # "domain.key_value.key": the node's name in stats and Decisions
    limit: LimitSpec | None
    value_to_metric: bool
    share_threshold: bool
    children: Level = field(default_factory=Level)


@dataclass(frozen=True, slots=True)
class Match:
    """What a descriptor found: its limit's node, its stats key, and per entry the
    pattern a share_threshold wildcard puts in the counter key (None: the value)."""

    node: Node
    stats_key: str
    shared: tuple[str | None, ...] | None


def wildcard_match(parts: Sequence[str], value: str) -> bool:
    """Whether ``value`` matches a pattern split on ``*``: it starts with the
    first part, ends with the last, and holds the others in order between."""
    if len(parts) == 1:
        return parts[0] == value
    first, last = parts[0], parts[-1]
    if len(value) < sum(map(len, parts)) or not value.startswith(first):
        return False
    if not value.endswith(last):
        return False
    at, end = len(first), len(value) - len(last)
    for part in parts[1:-1]:
        found = value.find(part, at, end)
        if found < 0:
            return False
        at = found + len(part)
    return True


class _Builder:
    def __init__(self, merge: bool) -> None:
        self.merge = merge
        self.domains: dict[str, Level] = {}

    def add(self, config: EnvoyFile, document: Document) -> None:
        domain = config.domain
        if not domain:
            raise _error(document, "$.domain", "domain", "config file cannot have empty domain")
        root = self.domains.get(domain)
        if root is not None and not self.merge:
            raise _error(
                document, "$.domain", "domain", f"duplicate domain {domain!r} in config file"
            )
        if root is None:
            root = self.domains[domain] = Level()
        self.level(root, config.descriptors or (), domain, document, "$.descriptors")

    def level(
        self,
        level: Level,
        descriptors: Sequence[EnvoyDescriptor],
        parent: str,
        document: Document,
        at: str,
    ) -> None:
        for i, d in enumerate(descriptors):
            here = f"{at}[{i}]"
            if not d.key:
                raise _error(document, f"{here}.key", "key", "descriptor has empty key")
            value = d.value or None
            path = f"{parent}.{d.key}" + ("" if value is None else f"_{value}")
            wildcard = value is not None and "*" in value
            if d.share_threshold and not wildcard:
                raise _error(
                    document, f"{here}.share_threshold", "share_threshold",
                    "share_threshold can only be used with wildcard values (containing '*'),"
                    f" but found key {path.rpartition('.')[2]!r}",
                )  # fmt: skip
            node = Node(
                d.key, value, path, self.limit(d, document, here), d.value_to_metric,
                d.share_threshold,
            )  # fmt: skip
            if value is None:
                taken = d.key in level.any_value
                level.any_value.setdefault(d.key, node)
            elif wildcard:
                taken = (d.key, value) in level.patterns
                if not taken:
                    level.patterns.add((d.key, value))
                    level.wildcards.setdefault(d.key, []).append((tuple(value.split("*")), node))
            else:
                taken = (d.key, value) in level.exact
                level.exact.setdefault((d.key, value), node)
            if taken:
                raise _error(document, here, None, f"duplicate descriptor composite key {path!r}")
            level.size += 1
            self.level(node.children, d.descriptors or (), path, document, f"{here}.descriptors")

    def limit(self, d: EnvoyDescriptor, document: Document, here: str) -> LimitSpec | None:
        limit = d.rate_limit
        if limit is None:
            return None
        where = f"{here}.rate_limit"
        unit = (limit.unit or "").lower()
        valid_unit = unit in UNIT_SECONDS
        if limit.unlimited:
            if valid_unit:
                raise _error(
                    document, f"{where}.unit", "rate_limit.unit",
                    "should not specify rate limit unit when unlimited",
                )  # fmt: skip
        elif not valid_unit:
            raise _error(
                document, f"{where}.unit", "rate_limit.unit",
                f"invalid rate limit unit {limit.unit or ''!r}: one of {', '.join(_UNITS)}",
            )  # fmt: skip
        per_unit = limit.requests_per_unit or 0
        if not 0 <= per_unit <= MAX_REQUESTS_PER_UNIT:
            raise _error(
                document, f"{where}.requests_per_unit", "rate_limit.requests_per_unit",
                f"requests_per_unit must be an integer from 0 to {MAX_REQUESTS_PER_UNIT},"
                f" got {per_unit}",
            )  # fmt: skip
        replaces: set[str] = set()
        for j, replace in enumerate(limit.replaces or ()):
            if not replace.name:
                raise _error(
                    document, f"{where}.replaces[{j}]", "rate_limit.replaces",
                    "should not have an empty replaces entry",
                )  # fmt: skip
            if replace.name == limit.name:
                raise _error(
                    document, f"{where}.replaces[{j}]", "rate_limit.replaces",
                    "replaces should not contain name of same descriptor",
                )  # fmt: skip
            replaces.add(replace.name)
        metadata = None
        if d.metadata:
            metadata = _json_safe(d.metadata, document, f"{here}.metadata")
        return LimitSpec(
            per_unit, unit if valid_unit else "", UNIT_SECONDS.get(unit, 0), limit.unlimited,
            limit.name or None, frozenset(replaces), d.shadow_mode, d.quota_mode,
            d.detailed_metric, metadata,
        )  # fmt: skip


def _json_safe(value: object, document: Document, at: str) -> dict[str, object]:
    """Metadata as a protobuf Struct can carry it: string keys; strings, finite
    numbers, booleans, null, lists and mappings of them."""

    def walk(item: object, where: str) -> object:
        if item is None or isinstance(item, bool | str | int):
            return item
        if isinstance(item, float):
            if math.isfinite(item):
                return item
        elif isinstance(item, list):
            return [walk(x, f"{where}[{i}]") for i, x in enumerate(item)]
        elif isinstance(item, dict):
            out = {}
            for k, v in item.items():
                if not isinstance(k, str):
                    raise _error(document, where, "metadata", f"metadata key {k!r} is not text")
                out[k] = walk(v, f"{where}.{k}")
            return out
        raise _error(document, where, "metadata", f"error parsing metadata: {item!r}")

    result = walk(value, at)
    assert isinstance(result, dict)  # the schema's type: a mapping
    return result


def _error(document: Document, at: str, name: str | None, reason: str) -> RuleFileError:
    return RuleFileError(Problem(document.filename, document.line_of(at), None, name, reason))


def build(files: Sequence[tuple[EnvoyFile, Document]], *, merge: bool) -> dict[str, Level]:
    """The domains' trees. ``merge``: files naming one domain add to it (a
    descriptor configured twice is still an error); else a second is an error."""
    builder = _Builder(merge)
    for config, document in files:
        builder.add(config, document)
    return builder.domains


def lookup(domain: str, root: Level, entries: Sequence[tuple[str, str]]) -> Match | None:
    """The limit ``entries`` get in ``root``, that service's way (module docstring)."""
    level = root
    last = len(entries) - 1
    found: Node | None = None
    value_key = [domain]  # the stats key as value_to_metric makes it
    shared: list[str | None] | None = None
    for i, (key, value) in enumerate(entries):
        node = level.exact.get((key, value)) if value else None
        by_value = node is not None
        pattern = None
        if node is None:
            for parts, candidate in level.wildcards.get(key, ()):
                if wildcard_match(parts, value):
                    node, pattern = candidate, candidate.value
                    break
        if node is None:
            node = level.any_value.get(key)
        if node is None:
            return None
        if pattern is not None:
            if node.share_threshold:
                if shared is None:
                    shared = [None] * len(entries)
                shared[i] = pattern
                shown: str | None = pattern
            else:
                shown = value if node.value_to_metric else pattern
        elif by_value or node.value_to_metric:
            shown = value
        else:
            shown = None
        value_key.append(f"{key}_{shown}" if shown else key)
        if i == last:
            found = node
        elif not node.children.size:
            return None
        level = node.children
    if found is None or found.limit is None:
        return None
    limit = found.limit
    if not limit.detailed:
        stats_key = ".".join(value_key)
    elif shared is not None:
        named = [domain]
        for (key, value), pattern in zip(entries, shared, strict=True):
            shown = pattern if pattern is not None else value
            named.append(f"{key}_{shown}" if shown else key)
        stats_key = ".".join(named)
    else:
        stats_key = ".".join([domain, *(f"{key}_{value}" for key, value in entries)])
    return Match(found, stats_key, None if shared is None else tuple(shared))
