"""envoyproxy/ratelimit configuration files, applied with that service's semantics.

A file has a ``domain`` and a tree of ``descriptors``; each node has a ``key``,
an optional ``value`` (exact, or a prefix wildcard ``foo*``), an optional
``rate_limit`` (``unit`` + ``requests_per_unit``, or ``unlimited: true``; a
``name``; ``replaces: [{name: ...}]``), ``shadow_mode``, ``detailed_metric`` and
nested ``descriptors``.

A request carries a domain and several descriptors, each a list of
``(key, value)`` entries. Each descriptor is looked up on its own, entry by entry
down the tree, taking at every level the most specific node: the exact
``key``/``value`` node, else a wildcard value that is a prefix of the value, else
the node with the ``key`` and no value (which matches any value; its counter is
kept per actual value). A descriptor gets the limit of the node its LAST entry
lands on, so a descriptor longer or shorter than the configured nesting gets no
limit. Then every limit named in a matched limit's ``replaces`` is dropped;
``unlimited`` limits never count; ``shadow_mode`` limits count but never deny; a
``requests_per_unit`` of 0 denies every request.

One difference, on purpose: envoy's service counts every hit, even one it
denies; here the enforced limits of one request are counted with one
``hit_many``, so a denied request counts nowhere (as everywhere in ratewarden).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import msgspec
import yaml

from .._decision import Decision
from .._errors import ConfigurationError
from .._limiter import AsyncLimiter, Limiter, ahit_tiers, hit_tiers
from .._rate import UNIT_SECONDS, Rate
from ..stores import AsyncMemoryStore, AsyncStore, MemoryStore, Store
from ._errors import Problem, RuleFileError
from ._source import Document, parse_text, read_file

__all__ = ["AsyncEnvoyConfig", "EnvoyConfig", "EnvoyLimit", "EnvoyResult"]

_UNITS = UNIT_SECONDS  # SECOND, MINUTE, ... YEAR (lower-cased), as envoy names them


class _Base(msgspec.Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    pass


class _Replace(_Base, frozen=True):
    name: str


class _RateLimit(_Base, frozen=True):
    unit: str | None = None
    requests_per_unit: int | None = None
    unlimited: bool = False
    name: str | None = None
    replaces: list[_Replace] = []


class _Descriptor(_Base, frozen=True):
    key: str
    # envoy's loader reads an unquoted number or boolean as its text; so do we
    value: str | int | float | bool | None = None
    rate_limit: _RateLimit | None = None
    descriptors: list[_Descriptor] = []
    shadow_mode: bool = False
    detailed_metric: bool = False


class _File(_Base, frozen=True):
    domain: str
    descriptors: list[_Descriptor] = []


@dataclass(slots=True)
class _Level:
    exact: dict[tuple[str, str], _Node] = field(default_factory=dict)
    wildcards: list[tuple[str, str, _Node]] = field(default_factory=list)
    any_value: dict[str, _Node] = field(default_factory=dict)


@dataclass(eq=False, slots=True)
class _Node:
    path: str  # "domain.key_value.key": names the node's limiter
    rate: Rate | None  # None: no rate_limit block, unlimited, or 0 per unit
    period: int  # seconds per unit (for a blocked limit's retry_after)
    blocked: bool  # requests_per_unit: 0
    unlimited: bool
    shadow: bool
    name: str | None
    replaces: frozenset[str]
    has_limit: bool
    children: _Level = field(default_factory=_Level)
    slot: int = -1


L = TypeVar("L", Limiter, AsyncLimiter)


class EnvoyLimit(msgspec.Struct, frozen=True):
    """The limit one descriptor of a request gets.

    ``limiter`` is None for ``unlimited`` and blocked (0 per unit) limits; ``key``
    is the counter key (the domain and the request's own entries).
    """

    descriptor: int
    path: str
    key: str
    limiter: Limiter | AsyncLimiter | None
    period: int = 0  # seconds per unit
    name: str | None = None
    shadow: bool = False
    unlimited: bool = False
    blocked: bool = False


class EnvoyResult(msgspec.Struct, frozen=True):
    """``overall_ok``: the request may pass (envoy's OK / OVER_LIMIT);
    ``decision``: the enforced limits' Decision (None if none counted);
    ``limits``: per descriptor, its limit or None (no limit: OK);
    ``shadow``: the Decision of the shadow-mode limits, reported, never denying."""

    overall_ok: bool
    decision: Decision | None
    limits: list[EnvoyLimit | None]
    shadow: Decision | None = None


class _EnvoyCore(Generic[L]):
    def __init__(self, files: Sequence[tuple[_File, Document]]) -> None:
        self.domains: dict[str, _Level] = {}
        self.limiters: list[L] = []
        for config, document in files:
            if config.domain in self.domains:
                raise RuleFileError(
                    Problem(
                        document.filename,
                        document.line_of("$.domain"),
                        None,
                        "domain",
                        f"domain {config.domain!r} is configured twice",
                    )
                )
            self.domains[config.domain] = self._level(
                config.descriptors, config.domain, document, "$.descriptors"
            )

    def _limiter(self, rate: Rate, name: str) -> L:  # pragma: no cover - the shells override
        raise NotImplementedError

    def _level(
        self, descriptors: list[_Descriptor], parent: str, document: Document, at: str
    ) -> _Level:
        level = _Level()
        for i, d in enumerate(descriptors):
            here: str = f"{at}[{i}]"

            def bad(where: str, reason: str, here: str = here) -> RuleFileError:
                line = document.line_of(f"{here}{where}")
                return RuleFileError(
                    Problem(document.filename, line, None, where.lstrip("."), reason)
                )

            if not d.key:
                raise bad(".key", "a descriptor needs a key")
            value = _text(d.value)
            path = f"{parent}.{d.key}" + ("" if value is None else f"_{value}")
            node = self._node(d, path, bad)
            node.children = self._level(d.descriptors, path, document, f"{here}.descriptors")
            if value is None:
                taken = d.key in level.any_value
                level.any_value[d.key] = node
            elif value.endswith("*"):
                prefix = value[:-1]
                taken = any(k == d.key and p == prefix for k, p, _ in level.wildcards)
                level.wildcards.append((d.key, prefix, node))
            else:
                taken = (d.key, value) in level.exact
                level.exact[(d.key, value)] = node
            if taken:
                raise bad("", f"duplicate descriptor composite key {path!r}")
        return level

    def _node(self, d: _Descriptor, path: str, bad: _Bad) -> _Node:
        limit = d.rate_limit
        if limit is None:
            return _Node(path, None, 0, False, False, d.shadow_mode, None, frozenset(), False)
        for j, replace in enumerate(limit.replaces):
            if not replace.name:
                raise bad(f".rate_limit.replaces[{j}]", "a replaces entry needs a name")
        replaces = frozenset(r.name for r in limit.replaces)
        if limit.name is not None and limit.name in replaces:  # envoy's service refuses it too
            raise bad(".rate_limit.replaces", f"limit {limit.name!r} replaces itself")
        if limit.unlimited:
            if limit.unit is not None or limit.requests_per_unit is not None:
                raise bad(".rate_limit", "an unlimited limit has no unit or requests_per_unit")
            return _Node(path, None, 0, False, True, d.shadow_mode, limit.name, replaces, True)
        if limit.unit is None or limit.unit.lower() not in _UNITS:
            raise bad(
                ".rate_limit.unit", f"unit must be one of {', '.join(_UNITS)}, got {limit.unit!r}"
            )
        if limit.requests_per_unit is None or limit.requests_per_unit < 0:
            raise bad(".rate_limit", "requests_per_unit must be given, an integer >= 0")
        period = _UNITS[limit.unit.lower()]
        if limit.requests_per_unit == 0:
            return _Node(path, None, period, True, False, d.shadow_mode, limit.name, replaces, True)
        rate = Rate(limit.requests_per_unit, period)
        node = _Node(path, rate, period, False, False, d.shadow_mode, limit.name, replaces, True)
        node.slot = len(self.limiters)
        self.limiters.append(self._limiter(rate, path))
        return node

    def limits_for(
        self, domain: str, descriptors: Iterable[Sequence[tuple[str, str]]]
    ) -> list[EnvoyLimit | None]:
        """Per descriptor (a list of ``(key, value)`` entries), the limit that
        applies, or None; after ``replaces`` has dropped what it names."""
        root = self.domains.get(domain)
        if root is None:
            raise ConfigurationError(f"no configuration for domain {domain!r}")
        found: list[tuple[_Node, str] | None] = []
        for entries in descriptors:
            node = _lookup(root, entries)
            if node is None or not node.has_limit:
                found.append(None)
                continue
            key = domain + "|" + "|".join(f"{_esc(k)}={_esc(v)}" for k, v in entries)
            found.append((node, key))
        replaced = frozenset().union(*(f[0].replaces for f in found if f is not None))
        out: list[EnvoyLimit | None] = []
        for i, item in enumerate(found):
            if item is None or (item[0].name is not None and item[0].name in replaced):
                out.append(None)
                continue
            node, key = item
            limiter = self.limiters[node.slot] if node.slot >= 0 else None
            out.append(
                EnvoyLimit(
                    i,
                    node.path,
                    key,
                    limiter,
                    node.period,
                    node.name,
                    node.shadow,
                    node.unlimited,
                    node.blocked,
                )
            )
        return out

    def _plan(
        self, limits: list[EnvoyLimit | None], hits_addend: int
    ) -> tuple[list[tuple[L, str, int]], list[tuple[L, str, int]], Decision | None]:
        if type(hits_addend) is not int or hits_addend < 0:
            raise ConfigurationError(f"hits_addend must be an integer >= 0, got {hits_addend!r}")
        cost = max(hits_addend, 1)  # envoy treats 0 as 1
        enforced: list[tuple[L, str, int]] = []
        shadow: list[tuple[L, str, int]] = []
        blocked = None
        for limit in limits:
            if limit is None or limit.unlimited:
                continue
            if limit.blocked:
                if not limit.shadow and blocked is None:
                    # never passes; retry_after says when envoy's window would reset
                    period = float(limit.period)
                    blocked = Decision(False, 0, 0, period, period, limit.path)
                continue
            item: tuple[L, str, int] = (limit.limiter, limit.key, cost)  # type: ignore[assignment]
            (shadow if limit.shadow else enforced).append(item)
        return enforced, shadow, blocked


def _lookup(root: _Level, entries: Sequence[tuple[str, str]]) -> _Node | None:
    level = root
    node = None
    for key, value in entries:
        node = level.exact.get((key, value))
        if node is None:
            for wild_key, prefix, candidate in level.wildcards:
                if wild_key == key and value.startswith(prefix):
                    node = candidate
                    break
            else:
                node = level.any_value.get(key)
        if node is None:
            return None
        level = node.children
    return node


def _text(value: str | float | bool | None) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _raw_values(node: yaml.Node | None, data: object) -> None:
    """Every descriptor ``value`` as the file spells it. envoyproxy/ratelimit reads
    values into a string field, so an unquoted ``01234`` is "01234", ``yes`` "yes",
    ``12:30`` "12:30"; YAML 1.1 resolution would make them 668, True and 750, and
    the limit would never match. An empty value means "any value", as there."""
    if isinstance(node, yaml.MappingNode) and isinstance(data, dict):
        for key_node, value_node in node.value:
            key = key_node.value
            if key not in data:
                continue
            if key == "value" and isinstance(value_node, yaml.ScalarNode):
                if data[key] is not None and not isinstance(data[key], str):
                    data[key] = value_node.value
                if data[key] == "":
                    data[key] = None
            else:
                _raw_values(value_node, data[key])
    elif isinstance(node, yaml.SequenceNode) and isinstance(data, list):
        for item_node, item in zip(node.value, data, strict=False):
            _raw_values(item_node, item)


def _esc(text: str) -> str:
    return text.replace("%", "%25").replace("|", "%7C").replace("=", "%3D")


class _Bad(Protocol):
    def __call__(self, where: str, reason: str) -> RuleFileError: ...


def _parse(
    paths: Sequence[str | os.PathLike[str]], texts: Sequence[str]
) -> list[tuple[_File, Document]]:
    documents = [read_file(p) for p in paths] + [parse_text(t, "<string>") for t in texts]
    out = []
    for document in documents:
        _raw_values(document.root, document.data)
        try:
            config = msgspec.convert(document.data, _File)
        except msgspec.ValidationError as exc:
            text, _, at = str(exc).partition(" - at `")
            path = at.rstrip("`") if at else "$"
            line = document.line_of(path, text)
            raise RuleFileError(Problem(document.filename, line, None, path, text)) from None
        out.append((config, document))
    return out


class EnvoyConfig(_EnvoyCore[Limiter]):
    """envoyproxy/ratelimit configuration, one file per domain, with a fixed-window
    `Limiter` per rate limit on ``store``; ``check(domain, descriptors,
    hits_addend)`` is what a gRPC ``ShouldRateLimit`` does."""

    def __init__(self, files: Sequence[tuple[_File, Document]], store: Store) -> None:
        self.store = store
        super().__init__(files)

    @classmethod
    def load(cls, *paths: str | os.PathLike[str], store: Store | None = None) -> EnvoyConfig:
        return cls(_parse(paths, ()), MemoryStore() if store is None else store)

    @classmethod
    def loads(cls, *texts: str, store: Store | None = None) -> EnvoyConfig:
        return cls(_parse((), texts), MemoryStore() if store is None else store)

    def _limiter(self, rate: Rate, name: str) -> Limiter:
        # envoy's windows are fixed and aligned to the unit, as fixed_window's are
        return Limiter(
            rate, store=self.store, algorithm="fixed_window", name=name, on_failure="fail_open"
        )

    def check(
        self, domain: str, descriptors: Iterable[Sequence[tuple[str, str]]], hits_addend: int = 1
    ) -> EnvoyResult:
        limits = self.limits_for(domain, descriptors)
        enforced, shadow, blocked = self._plan(limits, hits_addend)
        if blocked is not None:
            return EnvoyResult(False, blocked, limits)
        decision, report = hit_tiers(enforced, shadow) if enforced or shadow else (None, None)
        return EnvoyResult(decision is None or decision.allowed, decision, limits, report)


class AsyncEnvoyConfig(_EnvoyCore[AsyncLimiter]):
    """The asyncio twin of `EnvoyConfig`: ``await config.acheck(...)``."""

    def __init__(self, files: Sequence[tuple[_File, Document]], store: AsyncStore) -> None:
        self.store = store
        super().__init__(files)

    @classmethod
    def load(
        cls, *paths: str | os.PathLike[str], store: AsyncStore | None = None
    ) -> AsyncEnvoyConfig:
        return cls(_parse(paths, ()), AsyncMemoryStore() if store is None else store)

    def _limiter(self, rate: Rate, name: str) -> AsyncLimiter:
        return AsyncLimiter(
            rate, store=self.store, algorithm="fixed_window", name=name, on_failure="fail_open"
        )

    async def acheck(
        self, domain: str, descriptors: Iterable[Sequence[tuple[str, str]]], hits_addend: int = 1
    ) -> EnvoyResult:
        limits = self.limits_for(domain, descriptors)
        enforced, shadow, blocked = self._plan(limits, hits_addend)
        if blocked is not None:
            return EnvoyResult(False, blocked, limits)
        decision, report = (
            await ahit_tiers(enforced, shadow) if enforced or shadow else (None, None)
        )
        return EnvoyResult(decision is None or decision.allowed, decision, limits, report)
