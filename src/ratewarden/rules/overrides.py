"""Runtime overrides: an operator replaces a rule's rates for a while, without
editing the rule file, and every process applying that rule file follows.

This module holds what does no I/O: the records, checking an override against
the rules in force, and the limits a rule set runs with while overrides are in
force. Where the records live (this process, or Redis for every process sharing
a store) is `_override_stores`; an engine applies them through the part of it
that holds them (`_engine_overrides`).

An override names a rule and gives rates. A rule with one rate takes the one
rate given; a rule with several (``10/second`` and ``1000/hour``) has each
given rate replace the tier with the same window, so an operator can change one
tier and leave the others. An overridden tier counts afresh: its counters are
those of a different limit (see `Limiter`: the key prefix names the rate), and
when the override ends the rule's own counters, kept all along, are used again.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import replace

import msgspec

from ..primitives import ConfigurationError, Rate, parse_rate
from ._compile import RuleSet
from ._rule import CompiledRule, LimitSpec, spec_for

__all__ = [
    "MAX_DURATION",
    "MAX_REASON",
    "AuditEntry",
    "OverrideRecord",
    "RuntimeOverride",
    "UnknownRule",
    "check_override",
    "parse_duration",
    "substitutions",
]

MAX_DURATION = 30 * 86400  # an override is for an incident, not a new rule file
MAX_REASON = 500
MAX_BY = 200
MAX_RATES = 16
AUDIT_KEPT = 1000  # entries of the audit trail kept, newest first

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
# Characters that make one line of text look like another in a table, a log or
# a terminal: C0 and C1 controls (ESC, CSI), DEL, line and paragraph separators,
# the bidirectional controls (U+202E turns "ecila" into "alice") and the BOM.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e"
                  "\u2066\u2067\u2068\u2069\ufeff")  # fmt: skip
_UNPRINTABLE = frozenset(("Cc", "Zl", "Zp", "Cs", "Co", "Cn"))


class UnknownRule(ConfigurationError):
    """No rule of that name is in force: nothing to override."""


class OverrideRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """An override as it is stored: times are milliseconds since the epoch on
    the clock of the place it is stored in (Redis's TIME, or this process's
    clock), so that its expiry does not depend on the reader's clock."""

    rule: str
    limits: tuple[str, ...]
    file_limits: tuple[str, ...]  # what the rule file says: shown as replaced
    reason: str
    by: str
    set_at: int = 0
    expires_at: int = 0


class RuntimeOverride(msgspec.Struct, frozen=True):
    """An override in force, as the API and the CLI show it (seconds)."""

    rule: str
    limits: tuple[str, ...]
    replaces: tuple[str, ...]
    reason: str
    by: str
    set_at: float
    expires_at: float
    expires_in: float

    @classmethod
    def of(
        cls, record: OverrideRecord, now_ms: int, previous: tuple[str, ...] | None = None
    ) -> RuntimeOverride:
        replaces = record.file_limits if previous is None else previous
        left = max(0, record.expires_at - now_ms) / 1000
        return cls(record.rule, record.limits, replaces, record.reason, record.by,
                   record.set_at / 1000, record.expires_at / 1000, left)  # fmt: skip


class AuditEntry(msgspec.Struct, frozen=True):
    """One change: ``set`` (``limits`` replace ``replaces`` until ``expires_at``)
    or ``clear`` (the override of ``replaces`` ended early; ``limits`` is what
    the rule file says, in force again)."""

    action: str
    rule: str
    limits: tuple[str, ...]
    replaces: tuple[str, ...]
    reason: str
    by: str
    at: float
    expires_at: float


class StoredChange(msgspec.Struct, frozen=True):
    """An audit entry as it is stored: the record, and the override it replaced."""

    action: str
    at: int
    record: OverrideRecord
    previous: OverrideRecord | None = None

    def entry(self) -> AuditEntry:
        record, previous = self.record, self.previous
        if self.action == "set":
            replaces = record.file_limits if previous is None else previous.limits
            limits = record.limits
        else:
            replaces = () if previous is None else previous.limits
            limits = record.file_limits
        return AuditEntry(self.action, record.rule, limits, replaces, record.reason, record.by,
                          self.at / 1000, record.expires_at / 1000)  # fmt: skip


def parse_duration(value: object) -> float:
    """Seconds from ``90``, ``90.5``, ``"90s"``, ``"30m"``, ``"2h"``, ``"1d"`` or
    ``"1h30m"``; between 1 second and `MAX_DURATION`."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigurationError(f"a duration is seconds or text such as '30m', got {value!r}")
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"\d+(?:\.\d+)?", text):
            seconds = float(text)
        else:
            parts = _DURATION.findall(text)
            if not parts or "".join(n + u for n, u in parts) != text:
                raise ConfigurationError(
                    f"bad duration {value!r}: use seconds or a number and a unit,"
                    " such as 90s, 30m, 2h, 1d or 1h30m"
                )
            seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    else:
        seconds = float(value)
    if not 1 <= seconds <= MAX_DURATION:  # also refuses nan
        raise ConfigurationError(
            f"an override lasts from 1 second to {MAX_DURATION // 86400} days, got {value!r}"
        )
    return seconds


def check_text(name: str, value: object, most: int, *, required: bool) -> str:
    if not isinstance(value, str):
        raise ConfigurationError(f"{name} must be text, got {value!r}")
    text = value.strip()
    if required and not text:
        raise ConfigurationError(f"{name} is required: say why, for the audit trail")
    if len(text) > most:
        raise ConfigurationError(f"{name} is longer than {most} characters")
    if not text.isprintable() and any(_unprintable(c) for c in text):
        raise ConfigurationError(f"{name} must be one line of printable text")
    return text


def _unprintable(char: str) -> bool:
    return char in _BIDI or unicodedata.category(char) in _UNPRINTABLE


def _rate(text: str) -> Rate:
    """`parse_rate` for text from a client or another process: its digits must
    be ASCII (a superscript two passes ``isdigit`` and fails ``int``; Arabic-Indic
    digits would be read as ASCII ones)."""
    if not text.isascii():
        raise ConfigurationError(f"bad rate {text!r}: write it in ASCII, such as '500/minute'")
    try:
        return parse_rate(text)
    except ValueError as exc:  # ConfigurationError is one too; anything else the parser missed
        if isinstance(exc, ConfigurationError):
            raise
        raise ConfigurationError(f"bad rate {text!r}: {exc}") from None


def check_override(
    ruleset: RuleSet, rule_name: object, limits: object
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The override's rates written canonically, and the rule file's rates for
    the rule; `UnknownRule` or `ConfigurationError` (with the reason) when it
    cannot apply to ``ruleset``."""
    rule = ruleset.by_name.get(rule_name) if isinstance(rule_name, str) else None
    if rule is None:
        raise UnknownRule(f"no rule named {rule_name!r} in the rules in force")
    if isinstance(limits, str):
        limits = [part.strip() for part in limits.split(",")]
    if not isinstance(limits, list | tuple) or not limits:
        raise ConfigurationError("an override needs at least one rate, such as '500/minute'")
    if len(limits) > MAX_RATES:
        raise ConfigurationError(f"an override has at most {MAX_RATES} rates")
    rates = []
    for text in limits:
        if not isinstance(text, str):
            raise ConfigurationError(f"a rate is text such as '500/minute', got {text!r}")
        rates.append(_rate(text))
    _tiers(rule, rates)  # raises when they do not fit the rule
    return tuple(str(r) for r in rates), tuple(str(s.file_rate) for s in rule.limits)


def _tiers(rule: CompiledRule, rates: Sequence[Rate]) -> dict[int, Rate]:
    """Which of the rule's tiers (index into ``rule.limits``) each rate replaces."""
    specs = rule.limits
    if not specs:
        raise ConfigurationError(
            f"rule {rule.name!r} has no rate to override: it limits requests in flight only"
        )
    if len(specs) == 1:
        if len(rates) != 1:
            raise ConfigurationError(
                f"rule {rule.name!r} has one rate ({specs[0].file_rate}):"
                f" give one rate, not {len(rates)}"
            )
        return {0: rates[0]}
    by_window: dict[int, int] = {spec.rate.period_ns: n for n, spec in enumerate(specs)}
    out: dict[int, Rate] = {}
    for rate in rates:
        tier = by_window.get(rate.period_ns)
        if tier is None:
            have = ", ".join(str(s.file_rate) for s in specs)
            raise ConfigurationError(
                f"rule {rule.name!r} has rates {have}: {rate} has none of their windows"
                " (an override replaces the rate with the same window)"
            )
        if tier in out:
            raise ConfigurationError(f"two rates given for the window of {specs[tier].file_rate}")
        out[tier] = rate
    return out


def substitutions(
    ruleset: RuleSet, active: Mapping[str, OverrideRecord]
) -> tuple[dict[int, LimitSpec], list[str]]:
    """The limits (by slot) that ``active`` overrides replace in ``ruleset``, and
    a message for each override that does not apply to it (a rule this rule file
    does not have, or rates that do not fit it: another file's override)."""
    out: dict[int, LimitSpec] = {}
    problems: list[str] = []
    for name, record in active.items():
        rule = ruleset.by_name.get(name)
        if rule is None:
            problems.append(f"override of {name!r} ignored: no rule of that name here")
            continue
        try:
            tiers = _tiers(rule, [_rate(text) for text in record.limits])
        except ConfigurationError as exc:
            problems.append(f"override of {name!r} ignored: {exc}")
            continue
        for tier, rate in tiers.items():
            spec = rule.limits[tier]
            # The name stays the rule's, so Decisions name the rule; the rate
            # differs, so the counters are the override's own (see Limiter).
            # What the rate shapes is worked out again from the rule, as the
            # compiler does: a queue's line (no longer than max_wait at the new
            # rate), a degrade rule's ceiling and the level's start.
            plain = replace(spec, rate=rate, burst=rule.rule.burst, degrade_from=None)
            out[rule.slots[tier]] = spec_for(rule.rule, plain)
    return out, problems
