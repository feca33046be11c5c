"""``envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas``:
each usage report read into `rlqs.Usage`s (where what can be wrong with one is
refused with a gRPC status), and the actions written back as one
RateLimitQuotaResponse a report.

The stream answers each report as it comes (Envoy reports every bucket each
reporting interval, and a new bucket at once), and between reports sends what
a rebalance of a bucket decided (`rlqs.QuotaService`): a reader and a writer,
with what waits to be written bounded by the buckets the stream holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from google.protobuf.message import DecodeError

from ..primitives import ConfigurationError, StoreError
from ..rlqs import Action, QuotaService, QuotaStream, TooManyBuckets, Usage
from ..rlqs.assignment import FILL
from ..rlqs.config import BucketKey
from ._protos import messages
from .h2 import Call, GrpcError, Status

__all__ = ["RLQS_METHOD", "RLQS_SERVICE", "QuotaStreams"]


class _Outbox:
    """The actions waiting for the client to read them: the latest one a
    bucket, so that what waits is bounded by the buckets the stream holds
    however slowly the client reads."""

    def __init__(self) -> None:
        self._actions: dict[BucketKey, Action] = {}
        self._more = asyncio.Event()
        self._closed = False

    def put(self, actions: list[Action]) -> None:
        for action in actions:
            self._actions.pop(action.bucket, None)  # in the order they were decided
            self._actions[action.bucket] = action
        if actions:
            self._more.set()

    def close(self) -> None:
        self._closed = True
        self._more.set()

    async def drain(self, call: Call, encode: Callable[[list[Action]], bytes]) -> None:
        """Sends what is put, as it comes; after `close`, what is left, then ends."""
        while True:
            if not self._actions:
                if self._closed:
                    return
                self._more.clear()
                await self._more.wait()
                continue
            actions = list(self._actions.values())
            self._actions.clear()
            await call.send(encode(actions))


RLQS_SERVICE = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"
RLQS_METHOD = f"/{RLQS_SERVICE}/StreamRateLimitQuotas"

# a bucket id's bounds: Envoy builds it from a few request attributes
MAX_ENTRIES = 32
MAX_TEXT = 1024

log = logging.getLogger("ratewarden.server")


class QuotaStreams:
    """The streaming method, answered by ``service``."""

    def __init__(self, service: QuotaService) -> None:
        self.service = service
        m = messages()
        self.Reports = m["RateLimitQuotaUsageReports"]
        self.Response = m["RateLimitQuotaResponse"]

    async def stream(self, call: Call) -> None:
        quota = self.service.open()
        outbox = _Outbox()
        quota.on_push = outbox.put
        reading = asyncio.ensure_future(self._read(call, quota, outbox))
        writing = asyncio.ensure_future(outbox.drain(call, self._response))
        try:
            done, _ = await asyncio.wait((reading, writing), return_when=asyncio.FIRST_COMPLETED)
            if reading in done:
                reading.result()  # a refused report ends the call with its status
                outbox.close()  # the client is done: send what is queued, then end
                await writing
            else:
                writing.result()
        finally:
            quota.on_push = None
            for task in (reading, writing):
                task.cancel()
            quota.close()

    async def _read(self, call: Call, quota: QuotaStream, outbox: _Outbox) -> None:
        while (payload := await call.recv()) is not None:
            domain, usages = self._usages(payload)
            try:
                actions = await quota.report(domain, usages)
            except TooManyBuckets as exc:
                raise GrpcError(Status.RESOURCE_EXHAUSTED, str(exc)) from None
            except ConfigurationError as exc:
                raise GrpcError(Status.INVALID_ARGUMENT, str(exc)) from None
            except StoreError as exc:
                # the proxy keeps its assignments until they expire, then falls
                # back as its filter says; it opens a new stream at its next report
                log.warning("rlqs: the coordinator did not answer: %s", exc)
                raise GrpcError(Status.UNAVAILABLE, str(exc)) from None
            outbox.put(actions)

    def _usages(self, payload: bytes) -> tuple[str, list[Usage]]:
        try:
            reports = self.Reports.FromString(payload)
        except DecodeError as exc:
            message = f"not a RateLimitQuotaUsageReports: {exc}"
            raise GrpcError(Status.INVALID_ARGUMENT, message) from None
        usages = []
        for line in reports.bucket_quota_usages:
            bucket = dict(line.bucket_id.bucket)
            if not bucket:
                raise GrpcError(Status.INVALID_ARGUMENT, "a bucket id needs at least one entry")
            if len(bucket) > MAX_ENTRIES or any(
                not k or not v or len(k) > MAX_TEXT or len(v) > MAX_TEXT for k, v in bucket.items()
            ):
                raise GrpcError(
                    Status.INVALID_ARGUMENT,
                    f"a bucket id has at most {MAX_ENTRIES} entries, each of non-empty text"
                    f" of at most {MAX_TEXT} characters",
                )
            usages.append(Usage(bucket, line.num_requests_allowed, line.num_requests_denied))
        return reports.domain, usages

    def _response(self, actions: list[Action]) -> bytes:
        response: Any = self.Response()
        for action in actions:
            out = response.bucket_action.add()
            for key, value in action.bucket:
                out.bucket_id.bucket[key] = value
            if action.kind == "abandon":
                out.abandon_action.SetInParent()
                continue
            assignment = out.quota_assignment_action
            if action.ttl is not None:
                assignment.assignment_time_to_live.seconds = action.ttl
            strategy = assignment.rate_limit_strategy
            given = action.assignment
            if given is None or given.kind == "allow":
                strategy.blanket_rule = 0  # ALLOW_ALL
            elif given.kind == "deny":
                strategy.blanket_rule = 1  # DENY_ALL
            else:
                bucket = strategy.token_bucket
                bucket.max_tokens = given.max_tokens
                bucket.tokens_per_fill.value = given.tokens_per_fill
                bucket.fill_interval.seconds = FILL
        answer: bytes = response.SerializeToString()
        return answer
