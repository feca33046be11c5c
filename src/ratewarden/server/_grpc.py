"""``envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit``, with gRPC's
standard health and reflection services, on our own HTTP/2 server (`_h2grpc` over `_h2`).

The messages come from ``protos/*.proto`` (package data, written from the
documented messages and field numbers): grpcio-tools compiles them to
descriptors when the server starts (about 50 ms) into a pool of our own, and
protobuf makes the message classes from them. No generated code is committed
or built at install time, and reflection serves the very descriptors the
server decodes with. grpcio's own server is not used: see `_h2` for why.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import ssl
import tempfile
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from .._errors import ConfigurationError, StoreError
from ..envoy import OVERRIDE_UNITS, EnvoyResult, Override
from ..envoy.service import dynamic_metadata
from ._checks import decide, descriptors_check
from ._connection_limits import ConnectionLimits
from ._refusals import InvalidRequest
from ._serve import parse_address
from ._service import Service
from ._shapes import MAX_COST, MAX_DESCRIPTORS, MAX_ENTRIES
from ._verdict import Verdict, allowed, answer_headers, descriptor_statuses
from .h2 import Call, GrpcError, H2Server, Metadata, Method, Status

__all__ = ["SERVICE_NAME", "GrpcServer", "messages", "parse_tls"]

log = logging.getLogger("ratewarden.server")

SERVICE_NAME = "envoy.service.ratelimit.v3.RateLimitService"
METHOD = f"/{SERVICE_NAME}/ShouldRateLimit"
HEALTH = "grpc.health.v1.Health"
REFLECTION = "grpc.reflection.v1alpha.ServerReflection"
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"  # the same messages
_PROTOS = ("envoy_core.proto", "envoy_ratelimit_common.proto", "rls.proto", "health.proto",
           "reflection.proto")  # fmt: skip
_NAMES = {
    "RateLimitRequest": "envoy.service.ratelimit.v3.RateLimitRequest",
    "RateLimitResponse": "envoy.service.ratelimit.v3.RateLimitResponse",
    "RateLimitDescriptor": "envoy.extensions.common.ratelimit.v3.RateLimitDescriptor",
    "HeaderValue": "envoy.config.core.v3.HeaderValue",
    "HealthCheckRequest": "grpc.health.v1.HealthCheckRequest",
    "HealthCheckResponse": "grpc.health.v1.HealthCheckResponse",
    "ServerReflectionRequest": "grpc.reflection.v1alpha.ServerReflectionRequest",
    "ServerReflectionResponse": "grpc.reflection.v1alpha.ServerReflectionResponse",
}


class _Protos:
    """The compiled files (for reflection), their pool and the message classes."""

    def __init__(self) -> None:
        self.files = {f.name: f for f in _compile().file}
        # a pool of our own: the default one may hold grpcio's copies of the
        # health and reflection files, and one pool refuses a symbol twice
        self.pool = descriptor_pool.DescriptorPool()
        for file in self.files.values():
            self.pool.Add(file)
        self.classes: dict[str, Any] = {
            short: message_factory.GetMessageClass(self.pool.FindMessageTypeByName(full))
            for short, full in _NAMES.items()
        }


def _compile() -> descriptor_pb2.FileDescriptorSet:
    from grpc_tools import protoc  # noqa: PLC0415 - only when a gRPC server starts

    include = resources.files("grpc_tools") / "_proto"
    with (
        resources.as_file(resources.files("ratewarden.server") / "protos") as protos,
        resources.as_file(include) as well_known,
        tempfile.TemporaryDirectory(prefix="ratewarden-proto-") as out,
    ):
        target = Path(out) / "rls.desc"
        args = ["protoc", f"-I{protos}", f"-I{well_known}", f"--descriptor_set_out={target}",
                "--include_imports", *_PROTOS]  # fmt: skip
        if protoc.main(args) != 0:
            raise ConfigurationError(f"protoc could not compile {protos}/{_PROTOS}")
        return descriptor_pb2.FileDescriptorSet.FromString(target.read_bytes())


@functools.cache  # compiled once per process, when a gRPC server first needs it
def protos() -> _Protos:
    return _Protos()


def messages() -> dict[str, Any]:
    """The message classes by short name: RateLimitRequest, RateLimitResponse, ..."""
    return protos().classes


# envoy's RateLimit.Unit for a period in seconds (a period that is none of them: 0)
_UNITS = {1: 1, 60: 2, 3600: 3, 86400: 4, 30 * 86400: 5, 365 * 86400: 6, 7 * 86400: 7}
_OK, _OVER_LIMIT = 1, 2  # RateLimitResponse.Code
_UINT32 = 2**32 - 1


class _RateLimitService:
    def __init__(self, service: Service) -> None:
        self.service = service
        m = messages()
        self.Request = m["RateLimitRequest"]
        self.Response = m["RateLimitResponse"]
        self._observe = service.metrics.observe

    async def should_rate_limit(self, payload: bytes, metadata: Metadata) -> bytes:
        started = time.perf_counter()
        try:
            request = self.Request.FromString(payload)
        except DecodeError as exc:
            raise GrpcError(Status.INVALID_ARGUMENT, f"not a RateLimitRequest: {exc}") from None
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
        overrides = None if request.domain == self.service.domain else _overrides(descriptors)
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
            check = descriptors_check(request.domain, entries, cost, overrides,
                                      rules_domain=self.service.domain)  # fmt: skip
            verdict = await decide(self.service, check)
        except InvalidRequest as exc:
            raise GrpcError(Status.INVALID_ARGUMENT, str(exc)) from None
        except StoreError as exc:  # a limit whose failure policy is "raise"
            self.service.metrics.store_errors.inc()
            raise GrpcError(Status.UNAVAILABLE, str(exc)) from None
        response = self._response(verdict)
        if isinstance(verdict, EnvoyResult) and self.service.envoy_options.dynamic_metadata:
            each = [d.hits_addend.value if d.HasField("hits_addend") else None
                    for d in descriptors]  # fmt: skip
            shown = dynamic_metadata(request.domain, entries, overrides, verdict,
                                     addends=each, hits_addend=request.hits_addend)  # fmt: skip
            response.dynamic_metadata.update(shown)
        reply: bytes = response.SerializeToString()
        self._observe("grpc", time.perf_counter() - started)
        return reply

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


class _Health:
    """grpc.health.v1: "" and the rate limit service, SERVING until the drain."""

    SERVICE_UNKNOWN = 3

    def __init__(self) -> None:
        m = messages()
        self.Request, self.Response = m["HealthCheckRequest"], m["HealthCheckResponse"]
        self.status = {"": 0, SERVICE_NAME: 0}  # UNKNOWN until started
        self._changed = asyncio.Event()
        self.final = False

    def set(self, status: int, *, final: bool = False) -> None:
        """A new status for every service; ``final``: the server is stopping, and
        watchers get this status and then the end of their call."""
        for name in self.status:
            self.status[name] = status
        self.final = final
        self._changed.set()
        self._changed = asyncio.Event()

    def _service(self, payload: bytes) -> str:
        try:
            return str(self.Request.FromString(payload).service)
        except DecodeError as exc:
            raise GrpcError(Status.INVALID_ARGUMENT, f"not a HealthCheckRequest: {exc}") from None

    async def check(self, payload: bytes, metadata: Metadata) -> bytes:
        name = self._service(payload)
        if name not in self.status:
            raise GrpcError(Status.NOT_FOUND, f"unknown service {name!r}")
        answer: bytes = self.Response(status=self.status[name]).SerializeToString()
        return answer

    async def watch(self, call: Call) -> None:
        payload = await call.recv()
        name = self._service(payload or b"")
        last = None
        while True:
            status = self.status.get(name, self.SERVICE_UNKNOWN)
            if status != last:
                await call.send(self.Response(status=status).SerializeToString())
                last = status
            if self.final:  # a call open past the drain would hold the server up
                return
            await self._changed.wait()


class _Reflection:
    """grpc.reflection (v1alpha, and v1 on the same messages): the services, and
    the files that define a symbol or have a name, with their dependencies."""

    def __init__(self, services: list[str]) -> None:
        compiled = protos()
        self.files, self.pool = compiled.files, compiled.pool
        self.Request = compiled.classes["ServerReflectionRequest"]
        self.Response = compiled.classes["ServerReflectionResponse"]
        self.services = services

    async def info(self, call: Call) -> None:
        while (payload := await call.recv()) is not None:
            try:
                request = self.Request.FromString(payload)
            except DecodeError as exc:
                message = f"not a reflection request: {exc}"
                raise GrpcError(Status.INVALID_ARGUMENT, message) from None
            await call.send(self.answer(request).SerializeToString())

    def answer(self, request: Any) -> Any:
        response = self.Response(valid_host=request.host, original_request=request)
        which = request.WhichOneof("message_request")
        name = None
        if which == "list_services":
            for service in self.services:
                response.list_services_response.service.add(name=service)
            return response
        if which == "file_by_filename":
            name = request.file_by_filename if request.file_by_filename in self.files else None
        elif which == "file_containing_symbol":
            name = self._file_of(request.file_containing_symbol)
        elif which == "all_extension_numbers_of_type":
            try:
                self.pool.FindMessageTypeByName(request.all_extension_numbers_of_type)
            except KeyError:
                pass
            else:  # our messages have no extensions
                answer = response.all_extension_numbers_response
                answer.base_type_name = request.all_extension_numbers_of_type
                return response
        if name is None:
            response.error_response.error_code = Status.NOT_FOUND
            response.error_response.error_message = f"not found: {which}"
            return response
        response.file_descriptor_response.file_descriptor_proto.extend(
            self.files[n].SerializeToString() for n in self._with_dependencies(name)
        )
        return response

    def _file_of(self, symbol: str) -> str | None:
        """The file defining ``symbol``; for a method (``pkg.Service.Method``) or an
        enum value, which the pool does not index, the file of what holds it."""
        for _ in range(2):
            try:
                return str(self.pool.FindFileContainingSymbol(symbol).name)
            except KeyError:
                symbol = symbol.rpartition(".")[0]
                if not symbol:
                    return None
        return None

    def _with_dependencies(self, name: str) -> Iterator[str]:
        seen: set[str] = set()
        todo = [name]
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            yield current
            todo.extend(self.files[current].dependency)


class GrpcServer:
    """The rate limit, health and reflection services on one HTTP/2 listener."""

    def __init__(
        self,
        service: Service,
        address: str,
        *,
        token: str | None = None,
        tls: ssl.SSLContext | None = None,
        reuse_port: bool = False,
        limits: ConnectionLimits | None = None,
    ) -> None:
        self.service = service
        self.host, self.port = parse_address(address, "--grpc")
        # only workers sharing one store share a port: a second server on a taken
        # port must fail, not take half the calls with counters of its own
        self.reuse_port = reuse_port
        self.health = _Health()
        rls = _RateLimitService(service)
        # v1 is answered too, but not listed: its descriptors would be v1alpha's
        reflection = _Reflection([SERVICE_NAME, HEALTH, REFLECTION])
        methods = {
            METHOD: Method("unary", rls.should_rate_limit),
            f"/{HEALTH}/Check": Method("unary", self.health.check, public=True),
            f"/{HEALTH}/Watch": Method("streaming", self.health.watch, public=True),
            f"/{REFLECTION}/ServerReflectionInfo": Method("streaming", reflection.info),
            f"/{REFLECTION_V1}/ServerReflectionInfo": Method("streaming", reflection.info),
        }
        self.server = H2Server(
            methods, token=None if token is None else token.encode(), ssl_context=tls,
            limits=limits,
        )  # fmt: skip

    async def start(self) -> None:
        try:
            self.port = await self.server.listen(self.host, self.port, reuse_port=self.reuse_port)
        except OSError as exc:
            why = os.strerror(exc.errno) if exc.errno else str(exc)
            raise ConfigurationError(
                f"gRPC cannot listen on {self.host}:{self.port}: {why}"
            ) from None
        self.health.set(1)  # SERVING

    async def stop(self, grace: float) -> None:
        """Say NOT_SERVING, refuse new calls, let those in flight finish (``grace``)."""
        self.health.set(2, final=True)  # NOT_SERVING
        await self.server.stop(grace)


def parse_tls(cert: str | None, key: str | None, client_ca: str | None) -> ssl.SSLContext | None:
    """The TLS context for ``--grpc-cert/--grpc-key[/--grpc-client-ca]``: ALPN h2,
    TLS 1.2 or later, client certificates required when a CA is given (mTLS)."""
    if cert is None and key is None:
        if client_ca is not None:
            raise ConfigurationError("--grpc-client-ca needs --grpc-cert and --grpc-key")
        return None
    if cert is None or key is None:
        raise ConfigurationError("--grpc-cert and --grpc-key go together")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"])
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(f"--grpc-cert {cert} / --grpc-key {key}: {exc}") from None
    if client_ca is not None:
        try:
            context.load_verify_locations(cafile=client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(f"--grpc-client-ca {client_ca}: {exc}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context
