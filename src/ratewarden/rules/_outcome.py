"""`Outcome`: what the rule engine says about one request, and the response
headers it makes for the front end."""

from __future__ import annotations

from typing import Literal

import msgspec

from .._decision import Decision
from .._headers import Policy, rate_limit_headers
from . import _actions as act
from ._compile import Applicable, CompiledRule
from ._schema import Response

__all__ = ["Outcome", "Verdict"]

Verdict = Literal["allow", "reject", "delay", "shadow_ban", "queue", "degrade"]
_UNSHOWN = ("log_only", "degrade")  # limits the rate-limit headers leave out


class Outcome(msgspec.Struct, frozen=True):
    """What the engine says about one request, for the front end to act on.

    ``allowed``      proceed with the request;
    ``action``       ``"allow"``, ``"reject"`` (answer ``status``), ``"delay"``
                     (hold the request ``wait`` seconds, then check again; a front
                     end that cannot wait rejects with ``status``) or
                     ``"shadow_ban"`` (answer ``response`` without processing),
                     ``"queue"`` (allowed: hold the request ``wait`` seconds, then
                     let it through; its slot is taken) or ``"degrade"``
                     (allowed: serve it, at the lower quality ``degrade`` asks);
    ``decision``     the Decision of the enforced limits (None: none applied);
    ``rule``         the rule that denied, when denied (allowed: the queue or
                     degrade rule that shaped the request, if one did);
    ``status``       the HTTP status to answer: 200 when allowed;
    ``retry_after``  seconds until this request would pass (``decision``'s);
    ``shadow``       the Decision of the ``log_only`` limits (None: none applied);
                     ``shadow.allowed`` False means they would have denied, and
                     ``shadow.rule`` names one that would have;
    ``limits``       every limit that applied;
    ``degrade``      how much to degrade the response, 0 (not at all) to 1, when a
                     ``degrade`` rule's caller is over its limit.
    """

    allowed: bool
    action: Verdict
    decision: Decision | None
    rule: CompiledRule | None = None
    status: int = 200
    retry_after: float = 0.0
    wait: float = 0.0
    response: Response | None = None
    shadow: Decision | None = None
    limits: tuple[Applicable, ...] = ()
    degrade: float = 0.0

    def __bool__(self) -> bool:
        return self.allowed

    def headers(self, *, legacy: bool = True, ietf: bool = True) -> list[tuple[str, str]]:
        """The response headers for this outcome (see `ratewarden._headers`):
        X-RateLimit-* (``legacy``) and RateLimit / RateLimit-Policy (``ietf``) for
        the enforced limit closest to denying, and Retry-After when denied. An
        empty list when no enforced limit applied; ``log_only`` and ``degrade``
        limits never show. A degraded request gets its rule's degrade header, if
        the rule names one (`degrade_headers`)."""
        if self.decision is None:
            return self.degrade_headers()
        policies: dict[str, Policy] = {}
        for applicable in self.limits:
            if applicable.rule.action in _UNSHOWN:
                continue
            spec = applicable.limit
            quota = spec.rate.limit if spec.burst is None else spec.burst
            policies.setdefault(spec.name, Policy(spec.name, quota, spec.rate.period))
        headers = rate_limit_headers(self.decision, policies.values(), legacy=legacy, ietf=ietf)
        return headers + self.degrade_headers() if self.degrade else headers

    def degrade_headers(self) -> list[tuple[str, str]]:
        """The degrade rule's own header (``X-RateLimit-Degraded: 1``, or the
        level) when the request is degraded and the rule asks for one."""
        if not self.degrade or self.rule is None:
            return []
        header = act.level_header(self.rule, self.degrade)
        return [] if header is None else [header]
