"""gRPC on our own HTTP/2 server (`h2`): the rate limit service (`_rls`), the
rate limit quota service (`_rlqs`), and
gRPC's standard health and reflection services beside it, on one listener.
grpcio's own server is not used: see `h2` for why.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Iterator
from typing import Any

from google.protobuf.message import DecodeError

from ..primitives import ConfigurationError
from ..stores import AsyncMemoryStore
from ._addresses import parse_address
from ._connection_limits import ConnectionLimits, ServerLimits
from ._protos import messages, protos
from ._rlqs import RLQS_METHOD, RLQS_SERVICE, QuotaStreams
from ._rls import METHOD, SERVICE_NAME, RateLimitService
from ._service import Service
from .h2 import Call, GrpcError, H2Server, Metadata, Method, Status

__all__ = ["METHOD", "SERVICE_NAME", "GrpcServer", "messages", "parse_tls"]

HEALTH = "grpc.health.v1.Health"
REFLECTION = "grpc.reflection.v1alpha.ServerReflection"
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"  # the same messages


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
        server_limits: ServerLimits | None = None,
    ) -> None:
        self.service = service
        self.host, self.port = parse_address(address, "--grpc")
        # only workers sharing one store share a port: a second server on a taken
        # port must fail, not take half the calls with counters of its own
        self.reuse_port = reuse_port
        self.health = _Health()
        rls = RateLimitService(service.checker, service.metrics)
        memory = type(service.store) is AsyncMemoryStore
        # v1 is answered too, but not listed: its descriptors would be v1alpha's
        reflection = _Reflection([SERVICE_NAME, RLQS_SERVICE, HEALTH, REFLECTION])
        quotas = QuotaStreams(service.rules.quotas)
        methods = {
            # on the memory store a check never waits: no task for it (h2._eager)
            METHOD: Method("unary", rls.should_rate_limit, eager=memory),
            RLQS_METHOD: Method("streaming", quotas.stream),
            f"/{HEALTH}/Check": Method("unary", self.health.check, public=True),
            f"/{HEALTH}/Watch": Method("streaming", self.health.watch, public=True),
            f"/{REFLECTION}/ServerReflectionInfo": Method("streaming", reflection.info),
            f"/{REFLECTION_V1}/ServerReflectionInfo": Method("streaming", reflection.info),
        }
        self.server = H2Server(
            methods, token=None if token is None else token.encode(), ssl_context=tls,
            limits=limits, server_limits=server_limits,
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
