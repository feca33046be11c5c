"""``envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`` on grpc.aio,
with the standard health and reflection services.

The messages come from ``protos/*.proto`` (package data, written from Envoy's
documented messages and field numbers): grpcio-tools compiles them to
descriptors when the server starts (about 50 ms), they join the default
descriptor pool, and protobuf makes the message classes from them. No generated
code is committed or built at install time, and reflection serves the very
descriptors the server decodes with.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from .._errors import ConfigurationError, StoreError
from ._core import MAX_COST, MAX_DESCRIPTORS, MAX_ENTRIES, CheckResult, bearer_matches
from ._service import InvalidRequest, Service

__all__ = ["SERVICE_NAME", "GrpcServer", "messages"]

log = logging.getLogger("ratewarden.server")

SERVICE_NAME = "envoy.service.ratelimit.v3.RateLimitService"
METHOD = f"/{SERVICE_NAME}/ShouldRateLimit"
_PROTOS = ("envoy_core.proto", "envoy_ratelimit_common.proto", "rls.proto")
_messages: dict[str, Any] | None = None


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


def messages() -> dict[str, Any]:
    """The message classes by short name: RateLimitRequest, RateLimitResponse, ..."""
    global _messages
    if _messages is not None:
        return _messages
    pool = descriptor_pool.Default()
    for file in _compile().file:
        try:
            pool.FindFileByName(file.name)
        except KeyError:
            pool.Add(file)
    names = {
        "RateLimitRequest": "envoy.service.ratelimit.v3.RateLimitRequest",
        "RateLimitResponse": "envoy.service.ratelimit.v3.RateLimitResponse",
        "RateLimitDescriptor": "envoy.extensions.common.ratelimit.v3.RateLimitDescriptor",
        "HeaderValue": "envoy.config.core.v3.HeaderValue",
    }
    _messages = {
        short: message_factory.GetMessageClass(pool.FindMessageTypeByName(full))
        for short, full in names.items()
    }
    return _messages


# envoy's RateLimit.Unit for a period in seconds (a period that is none of them: 0)
_UNITS = {1: 1, 60: 2, 3600: 3, 86400: 4, 30 * 86400: 5, 365 * 86400: 6, 7 * 86400: 7}


class _RateLimitService:
    def __init__(self, service: Service, token: str | None) -> None:
        self.service = service
        self._token = None if token is None else token.encode()
        m = messages()
        self.Request = m["RateLimitRequest"]
        self.Response = m["RateLimitResponse"]
        self.HeaderValue = m["HeaderValue"]
        self._observe = service.metrics.observe

    def handler(self) -> grpc.GenericRpcHandler:
        method = grpc.unary_unary_rpc_method_handler(
            self.should_rate_limit,
            request_deserializer=self.Request.FromString,
            response_serializer=self.Response.SerializeToString,
        )
        return grpc.method_handlers_generic_handler(SERVICE_NAME, {"ShouldRateLimit": method})

    async def should_rate_limit(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        started = time.perf_counter()
        if self._token is not None:
            sent = dict(context.invocation_metadata() or ()).get("authorization", "")
            if not bearer_matches(sent.encode(), self._token):
                await context.abort(
                    grpc.StatusCode.UNAUTHENTICATED, "a valid bearer token is needed"
                )
        if not request.domain:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the request needs a domain")
        if len(request.descriptors) > MAX_DESCRIPTORS or any(
            len(d.entries) > MAX_ENTRIES for d in request.descriptors
        ):  # the HTTP API's bounds: a request's work stays small
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"at most {MAX_DESCRIPTORS} descriptors of at most {MAX_ENTRIES} entries each",
            )
        descriptors = [[(e.key, e.value) for e in d.entries] for d in request.descriptors]
        cost = request.hits_addend or 1
        addends = {d.hits_addend.value for d in request.descriptors if d.HasField("hits_addend")}
        if len(addends) > 1:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "descriptors with different hits_addend: ratewarden counts a request once",
            )
        if addends:
            cost = addends.pop() or 1
        if cost > MAX_COST:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"hits_addend above {MAX_COST}")
        try:
            result = await self.service.check_descriptors(request.domain, descriptors, cost)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except StoreError as exc:  # a limit whose failure policy is "raise"
            self.service.metrics.store_errors.inc()
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        response = self._response(result)
        self._observe("grpc", time.perf_counter() - started)
        return response

    def _response(self, result: CheckResult) -> Any:
        response = self.Response(overall_code=1 if result.allowed else 2)
        for status in result.statuses or ():
            out = response.statuses.add(code=1 if status.code == "OK" else 2)
            if status.requests_per_unit is not None:
                out.current_limit.requests_per_unit = min(status.requests_per_unit, 2**32 - 1)
                out.current_limit.unit = _UNITS.get(status.unit_seconds or 0, 0)
                out.current_limit.name = status.limit or ""
                out.limit_remaining = min(status.remaining or 0, 2**32 - 1)
                if status.reset_after is not None:
                    out.duration_until_reset.seconds = math.ceil(status.reset_after)
        # Envoy adds these to the client's response, allowed or not
        for name, value in result.headers.items():
            response.response_headers_to_add.add(key=name.lower(), value=value)
        return response


class GrpcServer:
    """A grpc.aio server with the rate limit, health and reflection services."""

    def __init__(
        self,
        service: Service,
        address: str,
        *,
        token: str | None = None,
        tls: tuple[bytes, bytes, bytes | None] | None = None,
        reuse_port: bool = False,
    ) -> None:
        self.service = service
        # grpc turns SO_REUSEPORT on by default, so a second server on a taken port
        # would start and silently take half its calls (with counters of its own):
        # only workers sharing one store share a port
        self.server = grpc.aio.server(options=[("grpc.so_reuseport", int(reuse_port))])
        self.server.add_generic_rpc_handlers((_RateLimitService(service, token).handler(),))
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self.server)
        names = (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                 reflection.SERVICE_NAME)  # fmt: skip
        reflection.enable_server_reflection(names, self.server)
        try:
            if tls is None:
                self.port = self.server.add_insecure_port(address)
            else:
                cert, key, client_ca = tls
                credentials = grpc.ssl_server_credentials(
                    [(key, cert)], root_certificates=client_ca,
                    require_client_auth=client_ca is not None,
                )  # fmt: skip
                self.port = self.server.add_secure_port(address, credentials)
        except RuntimeError:  # grpc's way of saying the port is taken
            self.port = 0
        if self.port == 0:
            raise ConfigurationError(f"gRPC cannot listen on {address!r} (in use?)")

    async def set_serving(self, serving: bool) -> None:
        answer = health_pb2.HealthCheckResponse
        status = answer.SERVING if serving else answer.NOT_SERVING
        for name in ("", SERVICE_NAME):
            await self._health.set(name, status)

    async def start(self) -> None:
        await self.server.start()
        await self.set_serving(True)

    async def stop(self, grace: float) -> None:
        """Say NOT_SERVING, refuse new calls, let those in flight finish (``grace``)."""
        await self.set_serving(False)
        await self.server.stop(grace)


def parse_tls(cert: str | None, key: str | None, client_ca: str | None) -> Any:
    if cert is None and key is None:
        if client_ca is not None:
            raise ConfigurationError("--grpc-client-ca needs --grpc-cert and --grpc-key")
        return None
    if cert is None or key is None:
        raise ConfigurationError("--grpc-cert and --grpc-key go together")

    def read(path: str, option: str) -> bytes:
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise ConfigurationError(f"{option} {path}: {exc}") from exc

    ca = None if client_ca is None else read(client_ca, "--grpc-client-ca")
    return read(cert, "--grpc-cert"), read(key, "--grpc-key"), ca
