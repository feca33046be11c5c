"""The rule file as typed objects: what the file says, as written.

The Structs hold it as written (a single rate stays a string, a list stays a
list), so ``load -> dump -> load`` gives back equal objects; the compiler
(`_compile`) normalises. Reading a file into them, with every problem found,
is `_schema_checks`; how a problem of shape is found and said, `_schema_problems`.
"""

from __future__ import annotations

from typing import Literal

import msgspec
import yaml

__all__ = [
    "FRONT_END_ATTRIBUTES",
    "Action",
    "AdaptiveLimit",
    "CalendarSpec",
    "ClientIP",
    "CostFrom",
    "CountBy",
    "Defaults",
    "Degrade",
    "FailurePolicy",
    "Match",
    "PriorityFrom",
    "Refill",
    "Response",
    "RlqsBucket",
    "Rule",
    "RuleFile",
    "as_list",
    "dump",
    "rule_algorithm",
]

Action = Literal["reject", "log_only", "delay", "shadow_ban", "degrade", "queue"]
FailurePolicy = Literal["fail_open", "fail_closed", "local_fallback"]
Refill = Literal["continuous", "interval"]
# exact: every check asks the store; two_tier: counted locally, synced (Redis stores)
Counting = Literal["exact", "two_tier"]


class _Base(msgspec.Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    pass


class CostFrom(_Base, frozen=True):
    """Cost read from a request attribute, e.g. ``{attribute: body_size}``; a
    missing or non-numeric value costs ``default``. A cost is at least 1."""

    attribute: str
    default: int = 1


class CountBy(_Base, frozen=True):
    """Which responses a request counts by (``count``): only those whose status
    is in ``status``, or only those whose status is not in ``not_status``. A
    status is a number or a range ``"500-599"``. The request is counted when it
    is checked, and given back once its response says it does not count
    (`ratewarden.rules._settle`)."""

    status: list[int | str] = []
    not_status: list[int | str] = []


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


class CalendarSpec(_Base, frozen=True):
    """Windows on a time zone's calendar: a day, week, month or year from local
    midnight (see `ratewarden.algorithms.calendar`)."""

    tz: str
    week_start: str = "monday"


class Rule(_Base, frozen=True):
    name: str
    rate: str | list[str] = []  # a rule gives a rate, a concurrency, or both
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
    calendar: CalendarSpec | None = None
    # requests of one key in flight at once, each holding a lease (`rules._holds`)
    concurrency: int | None = None
    lease: float | None = None  # seconds a hold lasts unless released first
    # what the request counts, settled once it has run (`rules._settle`): only
    # the responses ``count`` names; ``settle``: the check's cost is an estimate,
    # corrected to the actual cost by the settle
    count: CountBy | None = None
    settle: bool = False


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


class RlqsBucket(_Base, frozen=True):
    """Envoy's Rate Limit Quota Service buckets that share a total across the
    proxies (``ratewarden.rlqs``): those of ``domain`` whose bucket id holds
    ``bucket``'s entries (``*``: any value); each distinct id gets ``rate``,
    split by ``algorithm``; ``lease``: seconds a proxy's share outlives its
    last report; ``abandon_after``: seconds without a request before a proxy
    is told to forget the bucket."""

    name: str
    domain: str
    rate: str
    bucket: dict[str, str] = {}
    algorithm: str = "fair_share"
    lease: float = 12.0  # Envoy 1.40 reports every 5 s: a lease outlives two reports
    abandon_after: float = 300.0


class RuleFile(_Base, frozen=True):
    rules: list[Rule] = []
    version: Literal[1] = 1
    defaults: Defaults = msgspec.field(default_factory=Defaults)
    client_ip: ClientIP = msgspec.field(default_factory=ClientIP)
    # attributes the application gives beyond the front ends' own: rules may read
    # them without a warning
    attributes: list[str] = []
    rlqs: list[RlqsBucket] = []


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
    if rule.calendar is not None:  # a calendar's periods are fixed windows
        return "fixed_window"
    return "leaky_bucket" if rule.action == "queue" else defaults.algorithm


def dump(rule_file: RuleFile) -> str:
    """The rule file as YAML that loads back into an equal `RuleFile`."""
    data = msgspec.to_builtins(rule_file)
    # allow_unicode=False: PyYAML writes some characters (U+0085, U+2028) raw, and
    # reads them back as line breaks; escaped, every string round-trips.
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=False, width=100)
