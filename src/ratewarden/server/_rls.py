"""``envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit``: a
RateLimitRequest read into a `Check` (where everything about it that can be
wrong is refused, its cost among it), and the `Verdict` written as a
RateLimitResponse, with the HTTP API's bounds on a request's size.
"""

from __future__ import annotations

import time
from typing import Any

from google.protobuf.message import DecodeError

from ..envoy import OVERRIDE_UNITS, EnvoyResult, Override
from ..envoy.shown import dynamic_metadata
from ..primitives import StoreError
from ._checker import Checker, DescriptorsCheck
from ._metrics import Metrics
from ._protos import messages
from ._refusals import InvalidRequest
from ._rls_wire import response_bytes
from ._shapes import MAX_COST, MAX_DESCRIPTORS, MAX_ENTRIES
from ._verdict import allowed, answer_headers, descriptor_statuses
from .h2 import GrpcError, Metadata, Status

__all__ = ["METHOD", "SERVICE_NAME", "RateLimitService"]

_EMPTY = "every descriptor needs at least one entry"
_TOO_MANY = f"at most {MAX_DESCRIPTORS} descriptors of at most {MAX_ENTRIES} entries each"

SERVICE_NAME = "envoy.service.ratelimit.v3.RateLimitService"
METHOD = f"/{SERVICE_NAME}/ShouldRateLimit"


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
            self._metrics.tally.store_errors += 1
            raise GrpcError(Status.UNAVAILABLE, str(exc)) from None
        statuses = descriptor_statuses(verdict) or ()
        reply: bytes = response_bytes(allowed(verdict), statuses, answer_headers(verdict).items())
        if isinstance(verdict, EnvoyResult) and self._rules.envoy_options.dynamic_metadata:
            # a Struct is protobuf's to write: the answer read back, the metadata added
            response = self.Response.FromString(reply)
            each = [d.hits_addend.value if d.HasField("hits_addend") else None
                    for d in request.descriptors]  # fmt: skip
            shown = dynamic_metadata(check.domain, check.descriptors, check.overrides, verdict,
                                     addends=each, hits_addend=request.hits_addend)  # fmt: skip
            response.dynamic_metadata.update(shown)
            reply = response.SerializeToString()
        self._observe("grpc", time.perf_counter() - started)
        return reply

    def _check_of(self, request: Any) -> DescriptorsCheck:
        """The check a RateLimitRequest asks for; `GrpcError` (INVALID_ARGUMENT)
        for anything about it that is wrong."""
        if not request.domain:
            raise GrpcError(Status.INVALID_ARGUMENT, "the request needs a domain")
        domain = request.domain
        descriptors = request.descriptors
        if (
            len(descriptors) > MAX_DESCRIPTORS
        ):  # the HTTP API's bounds: a request's work stays small
            raise GrpcError(Status.INVALID_ARGUMENT, _TOO_MANY)
        if not descriptors:
            raise GrpcError(Status.INVALID_ARGUMENT, "a check needs at least one descriptor")
        # the YAML rules have no per-request limits: an override is for envoy domains
        rules_domain = self._rules.domain
        ours = domain == rules_domain
        # one pass over the descriptors: read, bounded, and each one's hits_addend
        entries = []
        addend = None
        for d in descriptors:
            pairs = [(e.key, e.value) for e in d.entries]
            if len(pairs) > MAX_ENTRIES:
                raise GrpcError(Status.INVALID_ARGUMENT, _TOO_MANY)
            if ours and not pairs:  # an envoy domain's empty descriptor has no limit: OK
                raise GrpcError(
                    Status.INVALID_ARGUMENT, "every descriptor needs at least one entry"
                )
            entries.append(pairs)
            if d.HasField("hits_addend"):
                value = d.hits_addend.value
                if addend is not None and value != addend:
                    raise GrpcError(
                        Status.INVALID_ARGUMENT,
                        "descriptors with different hits_addend: ratewarden counts a request once",
                    )
                addend = value
        cost = (request.hits_addend if addend is None else addend) or 1
        if cost > MAX_COST:
            raise GrpcError(Status.INVALID_ARGUMENT, f"hits_addend above {MAX_COST}")
        overrides = None if ours else _overrides(descriptors)
        return DescriptorsCheck(domain, entries, cost, overrides)


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
