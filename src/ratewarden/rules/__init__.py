"""The rule engine: YAML policies compiled into an index, applied in one
``hit_many`` per request, reloaded without a deploy.

    ruleset = load("rules.yaml")                # RuleFileError names file:line, rule, field
    ruleset.evaluate({"method": "GET", "path": "/api/orders", "user": "u1"})  # pure
    engine = RuleEngine("rules.yaml", store)    # or AsyncRuleEngine with an async store
    outcome = engine.check(attributes)          # Outcome: allowed, action, status, ...

What each module holds:

- the rule file: ``_schema`` (its typed objects), ``_schema_checks`` (the file
  read into them, and every check that is not about types; a concurrency rule's
  in ``_schema_concurrency``), ``_schema_problems``
  (every problem of shape found and said), ``source`` (what is wrong with a file,
  said so an operator can fix it);
- its index, no I/O: ``_compile`` (`RuleSet`: which limits apply to a request,
  without looking at every rule), ``_rule`` (`CompiledRule`, `LimitSpec`,
  `Applicable`: the pieces it indexes), ``_paths`` (path patterns, matched all at
  once), ``_clientip`` (the client's address behind trusted proxies);
- applying it: ``_engine`` (`RuleEngine`, `AsyncRuleEngine`: one ``hit_many`` per
  request, reloads that never leave a bad set in force), ``_actions`` (`Outcome`
  and its response headers), ``_limits_in_force`` (the limit a request meets now:
  an override's rate, an adaptive limit's size), ``_unidentified`` (the answer
  for a caller that could not be identified), ``_holds`` (the concurrency rules'
  slots: ``acquire`` and ``release``), ``_watcher`` (reloading a file
  when it changes);
- runtime overrides: ``overrides`` (the records and their checks, no I/O),
  ``_override_stores`` (where they live: this process, or Redis),
  ``_override_view`` (which are in force here, following a shared store), and
  ``_engine_overrides`` (the part of an engine that holds them).

envoyproxy/ratelimit's configuration format lives in `ratewarden.envoy`; its
names are also offered here, imported on first use.

This is the one part of ratewarden that imports PyYAML (``pip install
ratewarden[rules]``); ``import ratewarden`` does not import this package.
"""

from typing import TYPE_CHECKING, Any

# The ``x as x`` imports serve the neighbours, not users: importable here (``as``
# re-exports them to type checkers), kept out of __all__. The ASGI middleware waits
# out a delay with await_out; `ratewarden override` writes to RedisOverrides;
# LocalOverrides is the other kind of an engine's overrides_source; the tests cap
# rule files at MAX_BYTES and write them back as text with dump; /metrics and
# ratewarden.otel bound their latency histograms at LATENCY_BUCKETS.
from ._actions import Outcome, ShadowLog
from ._actions import await_out as await_out
from ._compile import Applicable, CompiledRule, Explanation, LimitSpec, RuleSet, load, loads
from ._engine import AsyncRuleEngine, RuleEngine
from ._holds import Admission, BadToken, HoldStats, LeaseGone
from ._override_stores import LocalOverrides as LocalOverrides
from ._override_stores import RedisOverrides as RedisOverrides
from ._schema import ClientIP, CostFrom, CountBy, Defaults, Match, Response, Rule, RuleFile
from ._schema import dump as dump
from ._settle import BadSettle, BadSettleToken, Settled, SettleRefused
from ._tally import LATENCY_BUCKETS as LATENCY_BUCKETS
from ._tally import Tally
from ._watcher import AsyncWatcher, Watcher
from .overrides import AuditEntry, RuntimeOverride, UnknownRule
from .source import MAX_BYTES as MAX_BYTES
from .source import Problem, RuleFileError

if TYPE_CHECKING:
    from ..envoy import AsyncEnvoyConfig, EnvoyConfig, EnvoyLimit, EnvoyResult, EnvoyStats, Override

_ENVOY = frozenset(
    ("AsyncEnvoyConfig", "EnvoyConfig", "EnvoyLimit", "EnvoyResult", "EnvoyStats", "Override")
)


def __getattr__(name: str) -> Any:
    """The envoy names, from `ratewarden.envoy` on first use: that package builds on
    this one, so importing it here at the start would be a cycle."""
    if name in _ENVOY:
        from .. import envoy  # noqa: PLC0415

        return getattr(envoy, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Admission",
    "Applicable",
    "AsyncEnvoyConfig",
    "AsyncRuleEngine",
    "AsyncWatcher",
    "AuditEntry",
    "BadSettle",
    "BadSettleToken",
    "BadToken",
    "ClientIP",
    "CompiledRule",
    "CostFrom",
    "CountBy",
    "Defaults",
    "EnvoyConfig",
    "EnvoyLimit",
    "EnvoyResult",
    "EnvoyStats",
    "Explanation",
    "HoldStats",
    "LeaseGone",
    "LimitSpec",
    "Match",
    "Outcome",
    "Override",
    "Problem",
    "Response",
    "Rule",
    "RuleEngine",
    "RuleFile",
    "RuleFileError",
    "RuleSet",
    "RuntimeOverride",
    "SettleRefused",
    "Settled",
    "ShadowLog",
    "Tally",
    "UnknownRule",
    "Watcher",
    "load",
    "loads",
]
