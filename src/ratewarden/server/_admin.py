"""The rules in force as the admin endpoints see them, apart from the HTTP that
carries them: what ``GET /v1/rules`` describes, and a key forgotten in their
limits (``DELETE /v1/keys/{key}``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._limiter import AsyncLimiter
from ._refusals import NotFound

if TYPE_CHECKING:
    from ._service import Service

__all__ = ["describe", "reset"]


def describe(service: Service) -> dict[str, Any]:
    ruleset = service.engine.ruleset
    rules = [
        {
            "name": r.name,
            "group": r.group,
            "priority": r.priority,
            "action": r.action,
            "by": list(r.by),
            "rates": [str(s.file_rate) for s in r.limits],
            "algorithm": r.limits[0].algorithm,
            "description": r.rule.description,
        }
        for r in ruleset.rules
    ]
    envoy = [] if service.envoy is None else sorted(service.envoy.domains)
    return {
        "source": ruleset.source,
        "domain": service.domain,
        "rules": rules,
        "envoy_domains": envoy,
        "store": type(service.store).__name__,
    }


async def reset(service: Service, key: str, rule: str | None = None) -> int:
    """Forget ``key`` in every limit (of ``rule``, if named); how many limits."""
    ruleset = service.engine.ruleset
    if rule is not None and rule not in ruleset.by_name:
        domain_paths = {name for name, _ in _envoy_limiters(service)}
        if rule not in domain_paths:
            raise NotFound(f"no rule named {rule!r}")
    count = 0
    for spec in ruleset.limits:
        if rule is not None and ruleset.by_limit_name[spec.name].name != rule:
            continue
        # the same name and limit on the same store: the engine's counters
        limiter = AsyncLimiter(
            spec.rate, store=service.store, algorithm=spec.algorithm, burst=spec.burst,
            refill=spec.refill, name=spec.name, on_failure=spec.on_failure,
        )  # fmt: skip
        await limiter.reset(key)
        count += 1
    for path, limiter in _envoy_limiters(service):
        if rule is None or rule == path:
            await limiter.reset(key)
            count += 1
    return count


def _envoy_limiters(service: Service) -> list[tuple[str, AsyncLimiter]]:
    if service.envoy is None:
        return []
    return [(lim.name or "", lim) for lim in service.envoy.limiters]
