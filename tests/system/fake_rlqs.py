"""A stand-in Rate Limit Quota Service for the harness's own tests: a grpcio
server that takes any method as raw bytes, decodes the few fields Envoy 1.40
fills in its usage reports, and answers each reported bucket with the action a
policy picks (a blanket rule or a token bucket), so that a test knows what
Envoy must enforce without ratewarden's own server.

The wire format is protobuf's, written out for the handful of messages the
test needs (field numbers from envoy/service/rate_limit_quota/v3/rlqs.proto and
envoy/type/v3/ratelimit_strategy.proto); Envoy 1.40 sends the usages as a
repeated field."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc

__all__ = ["PATH", "Action", "FakeRlqs", "Report", "Usage", "decode_report", "deny_all",
           "encode_response", "token_bucket"]  # fmt: skip

PATH = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"
_VARINT, _LEN = 0, 2


@dataclass(frozen=True)
class Usage:
    bucket: Mapping[str, str]
    allowed: int
    denied: int
    elapsed: int  # whole seconds: all Envoy 1.40 sends


@dataclass(frozen=True)
class Report:
    path: str
    domain: str
    usages: tuple[Usage, ...]
    at: float  # wall clock when it arrived


# an action's encoded RateLimitQuotaResponse.BucketAction.QuotaAssignmentAction
Action = bytes


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise ValueError("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) pairs: an int for varints, bytes for the rest."""
    at = 0
    while at < len(data):
        key, at = _read_varint(data, at)
        number, kind = key >> 3, key & 7
        if kind == _VARINT:
            value, at = _read_varint(data, at)
            yield number, value
        elif kind == _LEN:
            size, at = _read_varint(data, at)
            yield number, data[at : at + size]
            at += size
        elif kind in (1, 5):  # fixed64, fixed32: none expected, skipped
            at += 8 if kind == 1 else 4
        else:
            raise ValueError(f"wire type {kind} in a usage report")


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3 | _VARINT) + _varint(value)
    return _varint(number << 3 | _LEN) + _varint(len(value)) + value


def _bucket_id(data: bytes) -> dict[str, str]:
    bucket: dict[str, str] = {}
    for number, entry in _fields(data):
        if number == 1 and isinstance(entry, bytes):
            parts = {n: v for n, v in _fields(entry) if isinstance(v, bytes)}
            bucket[parts.get(1, b"").decode()] = parts.get(2, b"").decode()
    return bucket


def _int(value: int | bytes | None) -> int:
    return value if isinstance(value, int) else 0


def decode_report(raw: bytes, path: str = PATH) -> Report:
    """A RateLimitQuotaUsageReports message as Envoy 1.40 sends it."""
    domain, usages = "", []
    for number, value in _fields(raw):
        if number == 1 and isinstance(value, bytes):
            domain = value.decode()
        elif number == 2 and isinstance(value, bytes):
            got: dict[int, int | bytes] = dict(_fields(value))
            elapsed = got.get(2, b"")
            seconds = dict(_fields(elapsed)).get(1, 0) if isinstance(elapsed, bytes) else 0
            bucket = got.get(1, b"")
            usages.append(Usage(bucket=_bucket_id(bucket) if isinstance(bucket, bytes) else {},
                                allowed=_int(got.get(3)), denied=_int(got.get(4)),
                                elapsed=_int(seconds)))  # fmt: skip
    return Report(path=path, domain=domain, usages=tuple(usages), at=time.time())


def _strategy_action(strategy: bytes, ttl: int) -> Action:
    return _field(2, _field(1, ttl)) + _field(3, strategy)


def deny_all(ttl: int = 30) -> Action:
    """Deny every request of the bucket for ``ttl`` whole seconds."""
    return _strategy_action(_field(1, 1), ttl)


def token_bucket(per_second: int, burst: int, ttl: int = 30) -> Action:
    """``per_second`` requests a second, ``burst`` at once; whole seconds only,
    as Envoy 1.40 reads them."""
    bucket = _field(1, burst) + _field(2, _field(1, per_second)) + _field(3, _field(1, 1))
    return _strategy_action(_field(3, bucket), ttl)


def encode_response(actions: list[tuple[Mapping[str, str], Action]]) -> bytes:
    """A RateLimitQuotaResponse with one quota assignment per bucket."""
    out = b""
    for bucket, action in actions:
        entries = b"".join(_field(1, _field(1, k.encode()) + _field(2, v.encode()))
                           for k, v in sorted(bucket.items()))  # fmt: skip
        out += _field(1, _field(1, entries) + _field(2, action))
    return out


Policy = Callable[[Mapping[str, str]], Action | None]


class FakeRlqs:
    """Takes any gRPC method on a loopback port, keeps every report, and
    answers each report with ``policy``'s action for each of its buckets (None:
    no answer, so Envoy's no_assignment_behavior holds)."""

    def __init__(self, port: int, policy: Policy) -> None:
        self.port = port
        self.policy = policy
        self.reports: list[Report] = []
        self._lock = threading.Lock()
        self._server: Any = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        self._server.add_generic_rpc_handlers((_Handler(self),))
        if self._server.add_insecure_port(f"127.0.0.1:{port}") != port:
            raise RuntimeError(f"the fake RLQS server could not bind 127.0.0.1:{port}")

    def __enter__(self) -> FakeRlqs:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(0).wait()

    def heard(self, raw: bytes, path: str) -> bytes | None:
        report = decode_report(raw, path)
        with self._lock:
            self.reports.append(report)
        actions = [(u.bucket, a) for u in report.usages if (a := self.policy(u.bucket)) is not None]
        return encode_response(actions) if actions else None

    def totals(self) -> tuple[int, int]:
        """Allowed and denied requests summed over every report so far."""
        with self._lock:
            usages = [u for r in self.reports for u in r.usages]
        return sum(u.allowed for u in usages), sum(u.denied for u in usages)


class _Handler(grpc.GenericRpcHandler):  # type: ignore[misc]
    def __init__(self, fake: FakeRlqs) -> None:
        self.fake = fake

    def service(self, details: Any) -> Any:
        path = str(details.method)

        def stream(requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
            answers: queue.Queue[bytes | None] = queue.Queue()

            def read() -> None:
                try:
                    for raw in requests:
                        answer = self.fake.heard(raw, path)
                        if answer is not None:
                            answers.put(answer)
                except grpc.RpcError:
                    pass  # the stream cancelled: Envoy stopped, or the server did
                finally:
                    answers.put(None)

            threading.Thread(target=read, daemon=True).start()
            while (answer := answers.get()) is not None:
                yield answer

        return grpc.stream_stream_rpc_method_handler(stream)
