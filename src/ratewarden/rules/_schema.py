"""The rule file as typed objects, and every check that is not about types.

msgspec checks the shape (unknown fields, wrong types, bad enum values) in one
call, which stops at the first mismatch; when there is one, `_Shape` walks the
file field by field to find them all (an unknown field names the closest known
one, a bad enum value lists the valid ones) and keeps what has the right shape.
`_check` then checks the meaning of what was kept (rates, algorithms, path
patterns, which options go with which action, duplicate names): *every* problem
is reported at once, each with its line, rule and field. `undeclared` finds the
attributes a rule reads that no front end gives and the file does not declare:
warnings, since an application may give any attribute it likes.

The Structs hold what the file says, as written (a single rate stays a string,
a list stays a list), so ``load -> dump -> load`` gives back equal objects; the
compiler (`_compile`) normalises.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import ipaddress
import math
import re
import typing
from typing import Any, Literal, Protocol

import msgspec
import yaml

from ..algorithms import get_algorithm
from ..kernel import parse_floor
from ..primitives import ConfigurationError, parse_rate
from ..stores.shards import MAX_SHARDS
from ._paths import parse_pattern
from .source import Document, Problem, RuleFileError

__all__ = [
    "FRONT_END_ATTRIBUTES",
    "Action",
    "AdaptiveLimit",
    "ClientIP",
    "CostFrom",
    "Defaults",
    "Degrade",
    "Match",
    "PriorityFrom",
    "Response",
    "Rule",
    "RuleFile",
    "dump",
    "from_document",
    "undeclared",
]

Action = Literal["reject", "log_only", "delay", "shadow_ban", "degrade", "queue"]
FailurePolicy = Literal["fail_open", "fail_closed", "local_fallback"]
Refill = Literal["continuous", "interval"]
# exact: every check asks the store; two_tier: counted locally, synced (Redis stores)
Counting = Literal["exact", "two_tier"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_METHOD = re.compile(r"^[A-Za-z]+$")
_ATTRIBUTE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_BUCKETS = ("token_bucket", "leaky_bucket", "gcra")
_WINDOWS = ("fixed_window", "sliding_window_counter", "sliding_window_log")
_HEADER = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
MAX_QUEUE = 1_000_000  # waiting requests one queue rule holds at most


class _Base(msgspec.Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    pass


class CostFrom(_Base, frozen=True):
    """Cost read from a request attribute, e.g. ``{attribute: body_size}``; a
    missing or non-numeric value costs ``default``. A cost is at least 1."""

    attribute: str
    default: int = 1


class Match(_Base, frozen=True):
    """Where a rule applies: all given conditions must hold."""

    paths: str | list[str] = []
    methods: str | list[str] = []
    attributes: dict[str, str | list[str]] = {}


class Response(_Base, frozen=True):
    """What a shadow-banned request is answered (the front end sends it)."""

    status: int = 200
    body: str = ""
    headers: dict[str, str] = {}


class Degrade(_Base, frozen=True):
    """How an ``action: degrade`` rule tells the application to serve less.

    ``header``: send the level as a response header too (``true``:
    ``X-RateLimit-Degraded``; a string names another header); ``full_at``: the
    level grows from 0 at the rule's limit to 1 at ``full_at`` times it (a window
    algorithm counts the excess); without it the level is 1 whenever the caller is
    over the limit."""

    header: bool | str = False
    full_at: float | None = None


class PriorityFrom(_Base, frozen=True):
    """Waiting requests' classes from an attribute: ``order`` lists its values,
    the first served first; a value not listed (or none) waits behind them all."""

    attribute: str
    order: list[str]


class AdaptiveLimit(_Base, frozen=True):
    """A limit that follows a load signal (see `ratewarden.Adaptive`): the full
    limit while ``signal`` is at ``good`` or better, ``floor`` of it (``10%`` or
    0.1) at ``bad`` or worse, linear in between; the signal read every
    ``interval`` seconds, smoothed, and changes under ``dead_band`` ignored."""

    signal: str
    good: float
    bad: float
    floor: float | str = 0.1
    interval: float = 1.0
    smoothing: float = 0.3
    dead_band: float = 0.05


class Rule(_Base, frozen=True):
    name: str
    rate: str | list[str]
    description: str = ""
    group: str | None = None
    priority: int = 0
    by: str | list[str] = []
    match: Match | None = None
    global_: bool = msgspec.field(name="global", default=False)
    algorithm: str | None = None
    burst: int | None = None
    refill: Refill = "continuous"
    cost: int | CostFrom = 1
    action: Action = "reject"
    status: int | None = None
    max_wait: float | None = None
    response: Response | None = None
    on_failure: FailurePolicy | None = None
    store: Counting | None = None
    shards: int | None = None  # one key's limit split over this many cluster slots
    degrade: Degrade | None = None
    queue: int | None = None  # action queue: how many requests may wait in line
    priority_from: PriorityFrom | None = None
    adaptive: AdaptiveLimit | None = None


class ClientIP(_Base, frozen=True):
    """How ``by: ip`` finds the client: the peer address (attribute ``ip``), or,
    when the peer is a trusted proxy, the right-most untrusted address of
    ``header`` (X-Forwarded-For; ``forwarded`` reads RFC 7239's ``for=``)."""

    trusted_proxies: list[str] = []
    header: str = "x-forwarded-for"


class Defaults(_Base, frozen=True):
    algorithm: str = "sliding_window_counter"
    on_failure: FailurePolicy = "fail_open"
    store: Counting = "exact"


class RuleFile(_Base, frozen=True):
    rules: list[Rule]
    version: Literal[1] = 1
    defaults: Defaults = msgspec.field(default_factory=Defaults)
    client_ip: ClientIP = msgspec.field(default_factory=ClientIP)
    # attributes the application gives beyond the front ends' own: rules may read
    # them without a warning
    attributes: list[str] = []


# What the front ends put in a request's attributes, and so what a rule can read
# without the file declaring it: every framework integration (method, path, ip,
# headers, body_size, route), the identity that ``identify`` returns as the docs
# and the service's /auth headers name it (user, api_key, org, plan, host), and
# the envoy gRPC API (the domain, envoy's source and destination clusters).
FRONT_END_ATTRIBUTES = frozenset((
    "method", "path", "ip", "headers", "body_size", "route",
    "user", "api_key", "org", "plan", "host",
    "domain", "source", "dest",
))  # fmt: skip


def as_list(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def rule_algorithm(rule: Rule, defaults: Defaults) -> str:
    """The rule's algorithm: its own, else the leaky bucket for a queue (the
    queue is that bucket's schedule), else the file's default."""
    if rule.algorithm is not None:
        return rule.algorithm
    return "leaky_bucket" if rule.action == "queue" else defaults.algorithm


def from_document(document: Document) -> RuleFile:
    """Typed and checked, or `RuleFileError` listing every problem found."""
    try:
        rule_file = msgspec.convert(document.data, RuleFile)
    except msgspec.ValidationError as exc:
        raise _shape_problems(document, str(exc)) from None
    problems = _check(rule_file, document, None)
    if problems:
        raise RuleFileError(*_in_order(problems))
    return rule_file


def _shape_problems(document: Document, message: str) -> RuleFileError:
    """Every problem of a file whose shape msgspec refused (with ``message``)."""
    shape = _Shape(document)
    clean = shape.file(document.data)
    try:
        rule_file = msgspec.convert(clean, RuleFile)
    except msgspec.ValidationError:
        rule_file = None
    if rule_file is None or not shape.problems:
        # the walk keeps only values msgspec took one by one: this is a shape it
        # has no case for, so say what msgspec says of the whole
        return _type_problem(document, message)
    return RuleFileError(*_in_order(shape.problems + _check(rule_file, document, shape)))


def _in_order(problems: list[Problem]) -> list[Problem]:
    """As an operator reads the file: top to bottom (those without a line first)."""
    return sorted(problems, key=lambda p: p.line or 0)


def _closest(word: object, choices: typing.Iterable[object]) -> str | None:
    return _closest_of(str(word), tuple(str(c) for c in choices))


@functools.lru_cache(maxsize=1024)  # a file misspells the same few names again and again
def _closest_of(word: str, choices: tuple[str, ...]) -> str | None:
    found = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return found[0] if found else None


@functools.cache
def _fields(struct: type[msgspec.Struct]) -> dict[str, msgspec.structs.FieldInfo]:
    """A Struct's fields by their names in the file (msgspec resolves the
    annotations anew on every call)."""
    return {f.encode_name: f for f in msgspec.structs.fields(struct)}


def _struct_in(kind: Any) -> type[msgspec.Struct] | None:
    """The Struct a field's type holds (``Match | None``, ``int | CostFrom``), if any."""
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
        return kind
    for arg in typing.get_args(kind):
        if isinstance(arg, type) and issubclass(arg, msgspec.Struct):
            return arg
    return None


def _literals(kind: Any) -> list[object]:
    """The values a field's ``Literal`` type (maybe within ``| None``) allows."""
    if typing.get_origin(kind) is Literal:
        return list(typing.get_args(kind))
    return [value for arg in typing.get_args(kind) for value in _literals(arg)]


class _Shape:
    """Every shape problem of a file msgspec refused, and the part of it that has
    the right shape, so that `_check` can look at that too.

    A mapping's fields are taken one at a time: an unknown field is reported
    (with the closest known name) and left out, a value of the wrong type is
    reported and left out, a missing required field is reported unless an unknown
    one is its misspelling. A rule that lacks a required field cannot be checked
    further and is left out whole; ``kept`` holds the file index of each rule that
    stays. ``dropped`` holds, per kept rule, the fields that were left out or
    misspelt: what the file meant for them is unknown, so `_check` does not judge
    the fields that go with them. ``partial``: the fields whose own mapping lost
    a part."""

    def __init__(self, document: Document) -> None:
        self.document = document
        self.problems: list[Problem] = []
        self.kept: list[int] = []
        self.dropped: list[set[str]] = []
        self.partial: list[set[str]] = []
        self.file_dropped: set[str] = set()
        self.rules_given = False  # the file has a list of rules, not empty
        self.defaults_unsure = False  # the defaults that rules go by lost a part

    def _problem(self, path: str, rule: str | None, field: str | None, reason: str) -> None:
        line = self.document.line_of(path)
        self.problems.append(Problem(self.document.filename, line, rule, field, reason))

    def file(self, data: object) -> dict[str, object]:
        if not isinstance(data, dict):
            reason = "the file must be a mapping with a 'rules:' list, e.g. 'rules: [...]'"
            self._problem("$", None, None, reason)
            self.file_dropped.add("rules")
            return {"rules": []}
        clean, self.file_dropped, partial = self._mapping(
            data, RuleFile, "$", "", rule=None, skip={"rules"}
        )
        self.defaults_unsure = bool(partial.get("defaults", set()) & {"algorithm", "store"})
        rules = data.get("rules")
        kept: list[dict[str, object]] = []
        if isinstance(rules, list):
            self.rules_given = bool(rules)
            for i, item in enumerate(rules):
                at = f"$.rules[{i}]"
                rule = _rule_name(item, i)
                if not isinstance(item, dict):
                    self._type(item, Rule, at, rule, None)
                    continue
                fields, dropped, lost = self._mapping(item, Rule, at, "", rule=rule)
                if fields is not None:
                    kept.append(fields)
                    self.kept.append(i)
                    self.dropped.append(dropped)
                    self.partial.append(set(lost))
        elif "rules" in data:
            self._type(rules, list[Rule], "$.rules", None, "rules")
            self.file_dropped.add("rules")
        else:
            if "rules" not in self.file_dropped:  # else a misspelling says it
                self._problem("$", None, "rules", "missing required field 'rules'")
            self.file_dropped.add("rules")
        return {**(clean or {}), "rules": kept}

    def _mapping(
        self, data: dict[Any, Any], struct: type[msgspec.Struct], at: str, prefix: str, *,
        rule: str | None, skip: frozenset[str] | set[str] = frozenset(),
    ) -> tuple[dict[str, object] | None, set[str], dict[str, set[str]]]:  # fmt: skip
        """The fields of ``data`` that have the right shape (None if a required one
        is missing or wrong), the fields left out or misspelt, and for each field
        whose own mapping lost a part, the parts it lost."""
        fields = _fields(struct)
        clean: dict[str, object] = {}
        dropped: set[str] = set()
        partial: dict[str, set[str]] = {}
        for key, value in data.items():
            field = fields.get(key) if isinstance(key, str) else None
            if field is None:
                closest = _closest(key, fields)
                if closest is not None:
                    dropped.add(closest)
                    hint = f": did you mean {closest!r}?"
                else:
                    hint = f" (the fields here: {', '.join(fields)})"
                line = self.document.line_of_key(at, key)
                reason = f"unknown field {key!r}{hint}"
                self.problems.append(Problem(self.document.filename, line, rule, f"{prefix}{key}",
                                             reason))  # fmt: skip
                continue
            if key in skip:
                continue
            inner = _struct_in(field.type)
            if inner is not None and isinstance(value, dict):
                here = f"{at}.{key}"
                nested, lost, _ = self._mapping(value, inner, here, f"{prefix}{key}.", rule=rule)
                if nested is None:
                    dropped.add(key)
                else:
                    clean[key] = nested
                    if lost or len(nested) < len(value):
                        partial[key] = lost
            elif self._type(value, field.type, f"{at}.{key}", rule, f"{prefix}{key}"):
                clean[key] = value
            else:
                dropped.add(key)
        whole = True
        for field in fields.values():
            name = field.encode_name
            if field.required and name not in clean and name not in skip:
                whole = False
                if name not in data and name not in dropped and name not in skip:
                    self._problem(at, rule, f"{prefix}{name}", f"missing required field {name!r}")
        return (clean if whole else None), dropped, partial

    def _type(self, value: object, kind: Any, at: str, rule: str | None, field: str | None) -> bool:
        """Whether ``value`` is a ``kind``; if not, the problem is reported."""
        try:
            msgspec.convert(value, kind)
        except msgspec.ValidationError as exc:
            text, _, inside = str(exc).partition(" - at `")
            # "$[1]": an item of a list; "$[...]": a value of a mapping, no line of its own
            where = at + inside.rstrip("`").removeprefix("$").replace("[...]", "")
            choices = _literals(kind)
            if text.startswith("Invalid enum value") and choices:
                text += f": expected one of {', '.join(map(str, choices))}"
                closest = _closest(value, choices)
                if closest is not None:
                    text += f"; did you mean {closest!r}?"
            self._problem(where, rule, field, text)
            return False
        return True


def _rule_name(item: object, index: int) -> str:
    """How a problem names a rule: its name, else its place (``#3``)."""
    name = item.get("name") if isinstance(item, dict) else None
    return name if isinstance(name, str) else f"#{index + 1}"


def _type_problem(document: Document, message: str) -> RuleFileError:
    text, _, at = message.partition(" - at `")
    path = at.rstrip("`") if at else "$"
    if path == "$" and "Expected `object`" in text:
        text = "the file must be a mapping with a 'rules:' list, e.g. 'rules: [...]'"
    line = document.line_of(path, text)
    rule, field = _rule_and_field(document.data, path, text)
    return RuleFileError(Problem(document.filename, line, rule, field, text))


def _rule_and_field(data: object, path: str, text: str) -> tuple[str | None, str | None]:
    """The rule name (if the path is inside ``rules[i]``) and field the path names."""
    match = re.match(r"^\$\.rules\[(\d+)\](.*)$", path)
    unknown = re.search(r"unknown field `([^`]+)`", text)
    missing = re.search(r"missing required field `([^`]+)`", text)
    named = unknown or missing
    if match is None:
        field = path.removeprefix("$").lstrip(".") or None
        if named:
            field = f"{field}.{named[1]}" if field else named[1]
        return None, field
    index, rest = int(match[1]), match[2].lstrip(".")
    rule = f"#{index + 1}"
    if isinstance(data, dict):
        rules = data.get("rules")
        if isinstance(rules, list) and index < len(rules) and isinstance(rules[index], dict):
            name = rules[index].get("name")
            if isinstance(name, str):
                rule = name
    field = re.sub(r"\[\d+\]$", "", rest) or None
    if named:
        field = f"{field}.{named[1]}" if field else named[1]
    return rule, field


# Rule fields that no check of another field reads: a rule that lost one of these
# to a shape problem is still judged whole; one that lost any other field is not
# judged on how its fields go together (a misspelt 'action' would otherwise make
# every option of the intended action look out of place).
_ON_THEIR_OWN = frozenset(
    ("name", "description", "group", "priority", "by", "match", "global", "cost", "on_failure")
)


def _check(rule_file: RuleFile, document: Document, shape: _Shape | None) -> list[Problem]:
    """The meaning of a file (of its part with the right shape, given ``shape``)."""
    problems: list[Problem] = []
    filename = document.filename

    def problem(path: str, rule: str | None, field: str | None, reason: str) -> None:
        problems.append(Problem(filename, document.line_of(path), rule, field, reason))

    _check_file_level(rule_file, problem)
    # a list of rules that is missing or of the wrong shape is reported already
    if not rule_file.rules and (
        shape is None or not (shape.rules_given or "rules" in shape.file_dropped)
    ):
        problem("$.rules", None, "rules", "no rules: a rule file needs at least one")

    first_line: dict[str, int | None] = {}
    for i, rule in enumerate(rule_file.rules):
        at = f"$.rules[{i if shape is None else shape.kept[i]}]"
        name = rule.name
        # what the file meant for fields it got wrong is unknown: see _ON_THEIR_OWN
        whole = shape is None or not (shape.dropped[i] - _ON_THEIR_OWN or shape.defaults_unsure)
        partial = set() if shape is None else shape.partial[i]

        def bad(field: str, reason: str, path: str | None = None, name: str = name) -> None:
            problem(path or f"{at}.{field}", name, field, reason)  # noqa: B023

        if not _NAME.match(name):
            bad("name", "a name is letters, digits, '_', '.', '-', starting with a letter or digit")
        if name in first_line:
            bad("name", f"duplicate rule name (first at line {first_line[name]})")
        else:
            first_line[name] = document.line_of(f"{at}.name")
        _check_rates(rule, bad, at)
        if whole:
            _check_counting(rule, rule_file.defaults, bad)
        for j, who in enumerate(as_list(rule.by)):
            reason = _check_by(who)
            if reason:
                bad("by", reason, f"{at}.by" if isinstance(rule.by, str) else f"{at}.by[{j}]")
        if rule.match is not None:
            if rule.global_:
                bad("global", "a global rule applies everywhere: drop 'match' or 'global'")
            _check_match(rule.match, bad, f"{at}.match", whole="match" not in partial)
        if rule.group is not None and not rule.group:
            bad("group", "an empty group name: leave 'group' out for a rule of its own")
        if isinstance(rule.cost, int):
            if rule.cost < 1:
                bad("cost", f"cost must be a positive integer, got {rule.cost}")
        else:
            if not _ATTRIBUTE.match(rule.cost.attribute):
                bad("cost", f"bad attribute name {rule.cost.attribute!r}", f"{at}.cost.attribute")
            if rule.cost.default < 1:
                bad("cost", "the default cost must be a positive integer", f"{at}.cost.default")
        if whole:
            _check_action(rule, bad)
            _check_shaping(rule, rule_file.defaults, bad)
            if rule.adaptive is not None:
                _check_adaptive(rule, rule.adaptive, rule_algorithm(rule, rule_file.defaults), bad)
    return problems


def _check_file_level(rule_file: RuleFile, problem: _Problem) -> None:
    try:
        get_algorithm(rule_file.defaults.algorithm)
    except ConfigurationError as exc:
        problem("$.defaults.algorithm", None, "defaults.algorithm", str(exc))
    for i, proxy in enumerate(rule_file.client_ip.trusted_proxies):
        if proxy == "unix":  # a peer on a unix socket, which has no address
            continue
        try:
            ipaddress.ip_network(proxy, strict=False)
        except ValueError as exc:
            field = "client_ip.trusted_proxies"
            problem(f"$.client_ip.trusted_proxies[{i}]", None, field, str(exc))
    seen: set[str] = set()
    for i, declared in enumerate(rule_file.attributes):
        if not _ATTRIBUTE.match(declared):
            reason = f"bad attribute name {declared!r}: letters, digits, '_', '.', '-'"
            problem(f"$.attributes[{i}]", None, "attributes", reason)
        elif declared in seen:
            problem(f"$.attributes[{i}]", None, "attributes", f"{declared!r} is declared twice")
        seen.add(declared)


def _check_rates(rule: Rule, bad: _Bad, at: str) -> None:
    rates = as_list(rule.rate)
    if not rates:
        bad("rate", "no rate: give one like '100/minute' or a list of them")
    seen = set()
    for j, text in enumerate(rates):
        path = f"{at}.rate" if isinstance(rule.rate, str) else f"{at}.rate[{j}]"
        try:
            rate = parse_rate(text)
        except ConfigurationError as exc:
            bad("rate", str(exc), path)
            continue
        if rate in seen:
            bad("rate", f"rate {text!r} is given twice", path)
        seen.add(rate)


def _check_counting(rule: Rule, defaults: Defaults, bad: _Bad) -> None:
    """The algorithm and what goes with it: refill, store, shards, burst."""
    algorithm = rule_algorithm(rule, defaults)
    try:
        get_algorithm(algorithm, refill=rule.refill)
    except ConfigurationError as exc:
        bad("refill" if "refill" in str(exc) else "algorithm", str(exc))
        return
    if (rule.store or defaults.store) == "two_tier" and (
        algorithm == "sliding_window_log" or rule.refill == "interval"
    ):
        bad(
            "store",
            "store: two_tier counts fixed_window, sliding_window_counter and the continuous"
            f" buckets, not {algorithm!r}"
            + (" with refill: interval" if rule.refill == "interval" else ""),
        )
    if rule.shards is not None:
        _check_shards(rule, bad)
    if rule.burst is not None:
        if algorithm not in _BUCKETS:
            bad("burst", f"burst applies to {', '.join(_BUCKETS)}, not {algorithm!r}")
        elif rule.burst < 1:
            bad("burst", f"burst must be a positive integer, got {rule.burst}")


def _check_shards(rule: Rule, bad: _Bad) -> None:
    shards = rule.shards
    if shards is None:
        return
    if not 1 <= shards <= MAX_SHARDS:
        bad("shards", f"shards must be an integer from 1 to {MAX_SHARDS}, got {shards}")
        return
    # every shard holds a share of each rate (and of the burst): at least 1
    for text in as_list(rule.rate):
        with contextlib.suppress(ConfigurationError):  # a bad rate is reported already
            if parse_rate(text).limit < shards:
                bad("shards", f"shards: {shards} needs a limit of at least {shards} in every"
                    f" rate, got {text!r}")  # fmt: skip
    if rule.burst is not None and 1 <= rule.burst < shards:
        bad("shards", f"shards: {shards} needs a burst of at least {shards}, got {rule.burst}")


def _check_by(who: str) -> str | None:
    if who.startswith("header:"):
        header = who.removeprefix("header:")
        if not header or not re.match(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$", header):
            return f"'header:' needs a header name, got {who!r}"
        return None
    if not _ATTRIBUTE.match(who):
        return f"bad attribute name {who!r}: use user, api_key, ip, org, header:<name> or your own"
    return None


def _check_match(match: Match, bad: _Bad, at: str, *, whole: bool = True) -> None:
    """``whole``: the match lost no part to a shape problem, so an empty one is
    empty in the file too."""
    paths = as_list(match.paths)
    for j, pattern in enumerate(paths):
        try:
            parse_pattern(pattern)
        except ConfigurationError as exc:
            path = f"{at}.paths" if isinstance(match.paths, str) else f"{at}.paths[{j}]"
            bad("match.paths", str(exc), path)
    for j, method in enumerate(as_list(match.methods)):
        if not _METHOD.match(method):
            path = f"{at}.methods" if isinstance(match.methods, str) else f"{at}.methods[{j}]"
            bad("match.methods", f"bad method {method!r}", path)
    for key, values in match.attributes.items():
        if not _ATTRIBUTE.match(key):
            bad("match.attributes", f"bad attribute name {key!r}", f"{at}.attributes")
        if key in ("path", "method"):
            bad("match.attributes", f"match {key} with 'match.{key}s', not as an attribute",
                f"{at}.attributes.{key}")  # fmt: skip
        if not as_list(values):
            bad("match.attributes", f"no values for {key!r}", f"{at}.attributes.{key}")
    if whole and not (paths or as_list(match.methods) or match.attributes):
        bad("match", "an empty match: leave 'match' out (or say 'global: true') for everything")


def _check_action(rule: Rule, bad: _Bad) -> None:
    action = rule.action
    if rule.status is not None:
        if action != "reject":
            bad("status", f"'status' goes with action 'reject', not {action!r}")
        elif not 400 <= rule.status <= 599:
            bad("status", f"a reject status is 4xx or 5xx (429, 503), got {rule.status}")
    if action == "delay" and rule.max_wait is None:
        bad("max_wait", "action 'delay' needs 'max_wait' (seconds to hold a request)")
    if rule.max_wait is not None:
        if action not in ("delay", "queue"):
            bad("max_wait", f"'max_wait' goes with action 'delay' or 'queue', not {action!r}")
        elif not (math.isfinite(rule.max_wait) and 0 < rule.max_wait <= 3600):
            bad("max_wait", f"max_wait is seconds, > 0 and <= 3600, got {rule.max_wait}")
    if rule.response is not None:
        if action != "shadow_ban":
            bad("response", f"'response' goes with action 'shadow_ban', not {action!r}")
        elif not 100 <= rule.response.status <= 599:
            bad("response", f"bad status {rule.response.status}")


def _check_shaping(rule: Rule, defaults: Defaults, bad: _Bad) -> None:
    """The options of the degrade and queue actions and of priority classes."""
    action = rule.action
    if rule.degrade is not None:
        if action != "degrade":
            bad("degrade", f"'degrade' goes with action 'degrade', not {action!r}")
        else:
            _check_degrade(rule, rule.degrade, rule_algorithm(rule, defaults), bad)
    if action == "queue":
        _check_queue(rule, rule_algorithm(rule, defaults), (rule.store or defaults.store), bad)
    elif rule.queue is not None:
        bad("queue", f"'queue' goes with action 'queue', not {action!r}")
    if rule.priority_from is not None:
        order = rule.priority_from.order
        where = "priority_from"
        if action != "delay":
            bad(where, f"priority classes order waiting requests: action 'delay', not {action!r}")
        if not _ATTRIBUTE.match(rule.priority_from.attribute):
            bad(where, f"bad attribute name {rule.priority_from.attribute!r}")
        if not order:
            bad(where, "an empty order: list the attribute's values, the first served first")
        elif len(set(order)) != len(order):
            bad(where, "a value is listed twice in the order")


def _check_degrade(rule: Rule, degrade: Degrade, algorithm: str, bad: _Bad) -> None:
    header = degrade.header
    if isinstance(header, str) and not _HEADER.match(header):
        bad("degrade", f"bad header name {header!r}")
    full_at = degrade.full_at
    if full_at is None:
        return
    if not (math.isfinite(full_at) and 1 < full_at <= 100):
        bad("degrade", f"full_at is a multiple of the limit, > 1 and <= 100, got {full_at}")
    elif algorithm not in _WINDOWS:
        # a bucket's state is its debt, which says nothing of how fast a caller sends
        bad("degrade", "full_at measures how far over its window a caller is: use "
            f"{', '.join(_WINDOWS)}, not {algorithm!r}")  # fmt: skip


def _check_queue(rule: Rule, algorithm: str, store: str, bad: _Bad) -> None:
    if rule.queue is None:
        bad("queue", "action 'queue' needs 'queue': how many requests may wait in line")
    elif not 1 <= rule.queue <= MAX_QUEUE:
        bad("queue", f"queue is 1 to {MAX_QUEUE} waiting requests, got {rule.queue}")
    if algorithm not in ("leaky_bucket", "gcra"):
        bad("algorithm", f"a queue is a leaky bucket's schedule: leaky_bucket, not {algorithm!r}")
    if rule.burst is not None:
        bad("burst", "a queue releases one request at a time: give 'queue', not 'burst'")
    if store == "two_tier":
        bad("store", "a queue's slots are handed out one by one: store: exact, not two_tier")
    if rule.shards is not None and rule.shards > 1:
        bad("shards", "a queue's slots form one line: it cannot be split into shards")


def _check_adaptive(rule: Rule, adaptive: AdaptiveLimit, algorithm: str, bad: _Bad) -> None:
    if not _ATTRIBUTE.match(adaptive.signal):
        bad("adaptive", f"bad signal name {adaptive.signal!r}: letters, digits, '_', '.', '-'")
    if not (math.isfinite(adaptive.good) and math.isfinite(adaptive.bad)):
        bad("adaptive", "good and bad are finite numbers")
    elif adaptive.good == adaptive.bad:
        bad("adaptive", f"good and bad must differ, both are {adaptive.good}")
    try:
        parse_floor(adaptive.floor)
    except ConfigurationError as exc:
        bad("adaptive", str(exc))
    if not (math.isfinite(adaptive.interval) and 0 < adaptive.interval <= 3600):
        bad("adaptive", f"interval is seconds, > 0 and <= 3600, got {adaptive.interval}")
    if not 0 < adaptive.smoothing <= 1:
        bad("adaptive", f"smoothing is > 0 and <= 1 (1: none), got {adaptive.smoothing}")
    if not 0 <= adaptive.dead_band < 1:
        bad("adaptive", f"dead_band is >= 0 and < 1, got {adaptive.dead_band}")
    if algorithm == "sliding_window_log":
        bad("adaptive", "an adaptive limit counts in units, and sliding_window_log keeps one"
            " entry per unit: use sliding_window_counter, fixed_window or a bucket")  # fmt: skip
    if rule.action == "queue":
        bad("adaptive", "a queue's slots are spaced by its rate: it cannot be adaptive")


class _Bad(Protocol):  # the per-rule reporter the helpers are given
    def __call__(self, field: str, reason: str, path: str | None = None) -> None: ...


class _Problem(Protocol):  # the reporter of the file's own fields
    def __call__(self, path: str, rule: str | None, field: str | None, reason: str) -> None: ...


# What a rule does when an attribute it reads is never given, by the field that reads it
_WITHOUT = {
    "by": "the rule never applies",
    "match.attributes": "the rule never matches",
    "cost": "every request costs the default",
    "priority_from": "every request waits in the last class",
}


def undeclared(rule_file: RuleFile, document: Document | None) -> list[Problem]:
    """Warnings for the attributes rules read (``by``, ``match.attributes``, the
    attribute of ``cost`` and of ``priority_from``) that no front end gives
    (`FRONT_END_ATTRIBUTES`) and the file's ``attributes`` does not declare: most
    often a typo (``by: usr``), which leaves a rule that silently never applies.
    Each names the closest attribute known, if one is close."""
    known = FRONT_END_ATTRIBUTES | set(rule_file.attributes)
    filename = "<rules>" if document is None else document.filename
    warnings = []
    for i, rule in enumerate(rule_file.rules):
        at = f"$.rules[{i}]"
        # (attribute, field, path, key): a match attribute's line is its key's
        read: list[tuple[str, str, str, str | None]] = [
            (who, "by", f"{at}.by" + ("" if isinstance(rule.by, str) else f"[{j}]"), None)
            for j, who in enumerate(as_list(rule.by))
        ]
        if rule.match is not None:
            read += [(name, "match.attributes", f"{at}.match.attributes", name)
                     for name in rule.match.attributes]  # fmt: skip
        if isinstance(rule.cost, CostFrom):
            read.append((rule.cost.attribute, "cost", f"{at}.cost.attribute", None))
        if rule.priority_from is not None:
            attribute = rule.priority_from.attribute
            read.append((attribute, "priority_from", f"{at}.priority_from.attribute", None))
        for name, field, path, key in read:
            if name in known or name.startswith("header:"):
                continue
            line = None
            if document is not None:
                line = document.line_of(path) if key is None else document.line_of_key(path, key)
            closest = _closest(name, sorted(known))
            guess = "if" if closest is None else f"did you mean {closest!r}? If"
            reason = (
                f"no front end gives attribute {name!r}, nor does the file declare it (without"
                f" it {_WITHOUT[field]}): {guess} the application gives it, declare it:"
                f" 'attributes: [{name}]'"
            )
            warnings.append(Problem(filename, line, rule.name, field, reason))
    return warnings


def dump(rule_file: RuleFile) -> str:
    """The rule file as YAML that loads back into an equal `RuleFile`."""
    data = msgspec.to_builtins(rule_file)
    # allow_unicode=False: PyYAML writes some characters (U+0085, U+2028) raw, and
    # reads them back as line breaks; escaped, every string round-trips.
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=False, width=100)
