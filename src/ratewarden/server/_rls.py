"""``envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit``: a
RateLimitRequest read into a `Check` (where everything about it that can be
wrong is refused, its cost among it), and the `Verdict` written as a
RateLimitResponse, with the HTTP API's bounds on a request's size.
"""

from __future__ import annotations

import math
import time
from typing import Any

from google.protobuf.message import DecodeError

from .._errors import StoreError
from ..envoy import OVERRIDE_UNITS, EnvoyResult, Override
from ..envoy.service import dynamic_metadata
from ._checks import Checker, DescriptorsCheck, descriptors_check
from ._metrics import Metrics
from ._protos import messages
from ._refusals import InvalidRequest
from ._shapes import MAX_COST, MAX_DESCRIPTORS, MAX_ENTRIES
from ._verdict import Verdict, allowed, answer_headers, descriptor_statuses
from .h2 import GrpcError, Metadata, Status

__all__ = ["METHOD", "SERVICE_NAME", "RateLimitService"]

SERVICE_NAME = "envoy.service.ratelimit.v3.RateLimitService"
METHOD = f"/{SERVICE_NAME}/ShouldRateLimit"

# envoy's RateLimit.Unit for a period in seconds (a period that is none of them: 0)
_UNITS = {1: 1, 60: 2, 3600: 3, 86400: 4, 30 * 86400: 5, 365 * 86400: 6, 7 * 86400: 7}
_OK, _OVER_LIMIT = 1, 2  # RateLimitResponse.Code
_UINT32 = 2**32 - 1


class RateLimitService:
    """ShouldRateLimit, answered by ``checker`` and timed in ``metrics``."""

    def __init__(self, checker: Checker, metrics: Metrics) -> None:
        self._decide = checker.decide
        self._rules = checker.rules  # the domain and the envoy options
        self._metrics = metrics
        m = messages()
        self.Request = m["RateLimitRequest"]
        self.Response = m["RateLimitResponse"]
        self._observe = metrics.observe

    async def should_rate_limit(self, payload: bytes, metadata: Metadata) -> bytes:
        started = time.perf_counter()
        try:
            request = self.Request.FromString(payload)
        except DecodeError as exc:
            raise GrpcError(Status.INVALID_ARGUMENT, f"not a RateLimitRequest: {exc}") from None
        check = self._check_of(request)
        try:
            verdict = await self._decide(check)
        except InvalidRequest as exc:
            raise GrpcError(Status.INVALID_ARGUMENT, str(exc)) from None
        except StoreError as exc:  # a limit whose failure policy is "raise"
            self._metrics.store_errors.inc()
            raise GrpcError(Status.UNAVAILABLE, str(exc)) from None
        response = self._response(verdict)
        if isinstance(verdict, EnvoyResult) and self._rules.envoy_options.dynamic_metadata:
            each = [d.hits_addend.value if d.HasField("hits_addend") else None
                    for d in request.descriptors]  # fmt: skip
            shown = dynamic_metadata(check.domain, check.descriptors, check.overrides, verdict,
                                     addends=each, hits_addend=request.hits_addend)  # fmt: skip
            response.dynamic_metadata.update(shown)
        reply: bytes = response.SerializeToString()
        self._observe("grpc", time.perf_counter() - started)
        return reply

    def _check_of(self, request: Any) -> DescriptorsCheck:
        """The check a RateLimitRequest asks for; `GrpcError` (INVALID_ARGUMENT)
        for anything about it that is wrong."""
        if not request.domain:
            raise GrpcError(Status.INVALID_ARGUMENT, "the request needs a domain")
        descriptors = request.descriptors
        if len(descriptors) > MAX_DESCRIPTORS or any(
            len(d.entries) > MAX_ENTRIES for d in descriptors
        ):  # the HTTP API's bounds: a request's work stays small
            raise GrpcError(
                Status.INVALID_ARGUMENT,
                f"at most {MAX_DESCRIPTORS} descriptors of at most {MAX_ENTRIES} entries each",
            )
        entries = [[(e.key, e.value) for e in d.entries] for d in descriptors]
        # the YAML rules have no per-request limits: an override is for envoy domains
        rules_domain = self._rules.domain
        overrides = None if request.domain == rules_domain else _overrides(descriptors)
        cost = request.hits_addend or 1
        addends = {d.hits_addend.value for d in descriptors if d.HasField("hits_addend")}
        if len(addends) > 1:
            raise GrpcError(
                Status.INVALID_ARGUMENT,
                "descriptors with different hits_addend: ratewarden counts a request once",
            )
        if addends:
            cost = addends.pop() or 1
        if cost > MAX_COST:
            raise GrpcError(Status.INVALID_ARGUMENT, f"hits_addend above {MAX_COST}")
        try:
            return descriptors_check(request.domain, entries, cost, overrides,
                                     rules_domain=rules_domain)  # fmt: skip
        except InvalidRequest as exc:
            raise GrpcError(Status.INVALID_ARGUMENT, str(exc)) from None

    def _response(self, verdict: Verdict) -> Any:
        response = self.Response(overall_code=_OK if allowed(verdict) else _OVER_LIMIT)
        for status in descriptor_statuses(verdict) or ():
            out = response.statuses.add(code=_OVER_LIMIT if status.over else _OK)
            if status.per_unit is not None:
                out.current_limit.requests_per_unit = min(status.per_unit, _UINT32)
                out.current_limit.unit = _UNITS.get(status.unit_seconds or 0, 0)
                out.current_limit.name = status.name or ""
                out.limit_remaining = min(status.remaining or 0, _UINT32)
                if status.reset_after is not None:
                    out.duration_until_reset.seconds = math.ceil(status.reset_after)
            elif status.remaining is not None:  # an unlimited limit
                out.limit_remaining = min(status.remaining, _UINT32)
        # Envoy adds these to the client's response, allowed or not
        for name, value in answer_headers(verdict).items():
            response.response_headers_to_add.add(key=name.lower(), value=value)
        return response


def _overrides(descriptors: Any) -> list[Override | None] | None:
    """Each descriptor's ``limit`` override (requests per unit, unit), if any."""
    if not any(d.HasField("limit") for d in descriptors):
        return None
    out: list[Override | None] = []
    for i, d in enumerate(descriptors):
        if not d.HasField("limit"):
            out.append(None)
            continue
        unit = d.limit.unit
        if not 0 < unit < len(OVERRIDE_UNITS):
            raise GrpcError(
                Status.INVALID_ARGUMENT, f"descriptor {i}: the limit override needs a unit"
            )
        out.append((d.limit.requests_per_unit, OVERRIDE_UNITS[unit]))
    return out
