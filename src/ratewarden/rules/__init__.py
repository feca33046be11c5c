"""The rule engine: YAML policies compiled into an index, applied in one
``hit_many`` per request, reloaded without a deploy.

    ruleset = load("rules.yaml")                # RuleFileError names file:line, rule, field
    ruleset.evaluate({"method": "GET", "path": "/api/orders", "user": "u1"})  # pure
    engine = RuleEngine("rules.yaml", store)    # or AsyncRuleEngine with an async store
    outcome = engine.check(attributes)          # Outcome: allowed, action, status, ...

This is the one part of ratewarden that imports PyYAML (``pip install
ratewarden[rules]``); ``import ratewarden`` does not import this package.
"""

from ._compile import Applicable, CompiledRule, Explanation, LimitSpec, RuleSet, load, loads
from ._engine import AsyncRuleEngine, RuleEngine
from ._envoy import AsyncEnvoyConfig, EnvoyConfig, EnvoyLimit, EnvoyResult, Override
from ._envoystats import EnvoyStats
from ._errors import Problem, RuleFileError
from ._outcome import Outcome
from ._overrides import AuditEntry, RuntimeOverride, UnknownRule
from ._schema import ClientIP, CostFrom, Defaults, Match, Response, Rule, RuleFile, dump
from ._source import MAX_BYTES
from ._watcher import Watcher

__all__ = [
    "MAX_BYTES",
    "Applicable",
    "AsyncEnvoyConfig",
    "AsyncRuleEngine",
    "AuditEntry",
    "ClientIP",
    "CompiledRule",
    "CostFrom",
    "Defaults",
    "EnvoyConfig",
    "EnvoyLimit",
    "EnvoyResult",
    "EnvoyStats",
    "Explanation",
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
    "UnknownRule",
    "Watcher",
    "dump",
    "load",
    "loads",
]
