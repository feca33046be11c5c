"""A rule file read into its Structs, and every check that is not about types.

`from_document` converts the file in one msgspec call; when its shape is wrong,
`_schema_problems.Shape` finds every shape problem and keeps the part with the
right shape. `_check` then checks the meaning of what was kept (rates,
algorithms, path patterns, which options go with which action, duplicate
names): *every* problem is reported at once, each with its line, rule and
field. `undeclared` finds the attributes a rule reads that no front end gives
and the file does not declare: warnings, since an application may give any
attribute it likes.
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import re
from typing import Protocol

import msgspec

from ..algorithms import get_algorithm
from ..algorithms.calendar import Calendar, calendar_unit
from ..kernel import parse_floor
from ..primitives import ConfigurationError, parse_rate
from ..stores.shards import MAX_SHARDS
from ._paths import parse_pattern
from ._schema import (
    FRONT_END_ATTRIBUTES,
    AdaptiveLimit,
    CalendarSpec,
    CostFrom,
    Defaults,
    Degrade,
    Match,
    Rule,
    RuleFile,
    as_list,
    rule_algorithm,
)
from ._schema_concurrency import check_concurrency
from ._schema_problems import Shape, in_order, nearest, type_problem
from ._schema_settle import check_settle
from .source import Document, Problem, RuleFileError

__all__ = ["MAX_QUEUE", "from_document", "undeclared"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_METHOD = re.compile(r"^[A-Za-z]+$")
_ATTRIBUTE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_BUCKETS = ("token_bucket", "leaky_bucket", "gcra")
_WINDOWS = ("fixed_window", "sliding_window_counter", "sliding_window_log")
_HEADER = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
MAX_QUEUE = 1_000_000  # waiting requests one queue rule holds at most


def from_document(document: Document) -> RuleFile:
    """Typed and checked, or `RuleFileError` listing every problem found."""
    try:
        rule_file = msgspec.convert(document.data, RuleFile)
    except msgspec.ValidationError as exc:
        raise _shape_problems(document, str(exc)) from None
    problems = _check(rule_file, document, None)
    if problems:
        raise RuleFileError(*in_order(problems))
    return rule_file


def _shape_problems(document: Document, message: str) -> RuleFileError:
    """Every problem of a file whose shape msgspec refused (with ``message``)."""
    shape = Shape(document)
    clean = shape.file(document.data)
    try:
        rule_file = msgspec.convert(clean, RuleFile)
    except msgspec.ValidationError:
        rule_file = None
    if rule_file is None or not shape.problems:
        # the walk keeps only values msgspec took one by one: this is a shape it
        # has no case for, so say what msgspec says of the whole
        return type_problem(document, message)
    return RuleFileError(*in_order(shape.problems + _check(rule_file, document, shape)))


# Rule fields that no check of another field reads: a rule that lost one of these
# to a shape problem is still judged whole; one that lost any other field is not
# judged on how its fields go together (a misspelt 'action' would otherwise make
# every option of the intended action look out of place).
_ON_THEIR_OWN = frozenset(
    ("name", "description", "group", "priority", "by", "match", "global", "cost", "on_failure")
)


def _check(rule_file: RuleFile, document: Document, shape: Shape | None) -> list[Problem]:
    """The meaning of a file (of its part with the right shape, given ``shape``)."""
    problems: list[Problem] = []
    filename = document.filename

    def problem(path: str, rule: str | None, field: str | None, reason: str) -> None:
        problems.append(Problem(filename, document.line_of(path), rule, field, reason))

    _check_file_level(rule_file, problem)
    # a list of rules that is missing or of the wrong shape is reported already
    if (
        not rule_file.rules
        and not rule_file.rlqs
        and (shape is None or not (shape.rules_given or "rules" in shape.file_dropped))
    ):
        none = "no rules: a rule file needs at least one (or an rlqs section)"
        problem("$.rules", None, "rules", none)

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
        if whole and rule.calendar is not None:
            _check_calendar(rule, rule.calendar, rule_file.defaults, bad, at)
        if whole:
            _check_action(rule, bad)
            _check_shaping(rule, rule_file.defaults, bad)
            check_concurrency(rule, bad)
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
    _check_rlqs(rule_file, problem)


# what a fleet quota's allocation may be for Envoy's buckets (fleet.alloc's
# ALLOCATORS less ``static``, which needs a per-member cap no proxy states)
RLQS_ALGORITHMS = ("equal", "proportional_share", "fair_share")


def _check_rlqs(rule_file: RuleFile, problem: _Problem) -> None:
    """The ``rlqs`` entries: each named once, a domain, a bucket pattern of
    non-empty text, a rate, and a lease that outlives the reports it stands for."""
    names: set[str] = set()
    for i, entry in enumerate(rule_file.rlqs):
        at, name = f"$.rlqs[{i}]", entry.name

        def bad(field: str, reason: str, at: str = at, name: str = name) -> None:
            problem(f"{at}.{field}", f"rlqs {name}", field, reason)

        if not name.strip():
            bad("name", "an rlqs entry needs a name (it labels its metrics)")
        elif name in names:
            bad("name", f"the name {name!r} is used twice")
        names.add(name)
        if not entry.domain:
            bad("domain", "no domain: the one the proxies' filter reports under (its 'domain:')")
        for key, value in entry.bucket.items():
            if not key or not value:
                bad("bucket", f"bucket entries are non-empty text, got {key!r}: {value!r}")
        try:
            rate = parse_rate(entry.rate)
        except ConfigurationError as exc:
            bad("rate", str(exc))
        else:
            if rate.period_ns < 10_000_000 or rate.period_ns % 1_000_000:
                bad("rate", f"the window is a whole number of milliseconds, at least 10: {rate}")
        if entry.algorithm not in RLQS_ALGORITHMS:
            guess = nearest(entry.algorithm, RLQS_ALGORITHMS)
            bad("algorithm", f"one of {', '.join(RLQS_ALGORITHMS)}, got {entry.algorithm!r}"
                + (f" (did you mean {guess!r}?)" if guess else ""))  # fmt: skip
        if not math.isfinite(entry.lease) or entry.lease < 2:
            bad("lease", f"at least 2 seconds (two of the proxies' reports), got {entry.lease!r}")
        elif not math.isfinite(entry.abandon_after) or entry.abandon_after < entry.lease:
            reason = f"at least the lease ({entry.lease} s), got {entry.abandon_after!r}"
            bad("abandon_after", reason)


def _check_rates(rule: Rule, bad: _Bad, at: str) -> None:
    rates = as_list(rule.rate)  # none at all: `check_concurrency` says so
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


def _check_calendar(
    rule: Rule, calendar: CalendarSpec, defaults: Defaults, bad: _Bad, at: str
) -> None:
    """A calendar's zone and week start, and what goes with its fixed windows."""
    algorithm = rule_algorithm(rule, defaults)
    if algorithm != "fixed_window":
        bad("calendar", f"a calendar counts in fixed windows (its periods), not {algorithm!r}")
        return
    two_tier = (rule.store or defaults.store) == "two_tier"
    if rule.adaptive is not None or rule.shards not in (None, 1) or two_tier:
        bad("calendar", "a calendar limit is a plain fixed window: no adaptive, shards or two_tier")
    for rate in as_list(rule.rate):
        try:
            unit = calendar_unit(parse_rate(rate).period)
        except ConfigurationError as exc:
            bad("rate", str(exc))
            continue
        try:
            Calendar(calendar.tz, unit, calendar.week_start)
        except ConfigurationError as exc:
            field = "week_start" if "week_start" in str(exc) else "tz"
            bad("calendar", str(exc), f"{at}.calendar.{field}")
            return


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
    """The options of the degrade and queue actions, of priority classes and of
    the hits settled after the request (`check_settle`)."""
    action = rule.action
    check_settle(rule, (rule.store or defaults.store) == "two_tier", bad)
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
            closest = nearest(name, sorted(known))
            guess = "if" if closest is None else f"did you mean {closest!r}? If"
            reason = (
                f"no front end gives attribute {name!r}, nor does the file declare it (without"
                f" it {_WITHOUT[field]}): {guess} the application gives it, declare it:"
                f" 'attributes: [{name}]'"
            )
            warnings.append(Problem(filename, line, rule.name, field, reason))
    return warnings
