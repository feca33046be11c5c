"""The gRPC messages: ``protos/*.proto`` (package data, written from the
documented messages and field numbers) compiled by grpcio-tools to descriptors
when a gRPC server first needs them (about 50 ms), into a pool of our own, and
protobuf makes the message classes from them. No generated code is committed
or built at install time, and reflection serves the very descriptors the
server decodes with.
"""

from __future__ import annotations

import functools
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from ..primitives import ConfigurationError

__all__ = ["messages", "protos"]

_PROTOS = ("envoy_core.proto", "envoy_ratelimit_common.proto", "rls.proto", "health.proto",
           "reflection.proto", "envoy_type_strategy.proto", "rlqs.proto")  # fmt: skip
_NAMES = {
    "RateLimitRequest": "envoy.service.ratelimit.v3.RateLimitRequest",
    "RateLimitResponse": "envoy.service.ratelimit.v3.RateLimitResponse",
    "RateLimitDescriptor": "envoy.extensions.common.ratelimit.v3.RateLimitDescriptor",
    "HeaderValue": "envoy.config.core.v3.HeaderValue",
    "HealthCheckRequest": "grpc.health.v1.HealthCheckRequest",
    "HealthCheckResponse": "grpc.health.v1.HealthCheckResponse",
    "ServerReflectionRequest": "grpc.reflection.v1alpha.ServerReflectionRequest",
    "ServerReflectionResponse": "grpc.reflection.v1alpha.ServerReflectionResponse",
    "RateLimitQuotaUsageReports": "envoy.service.rate_limit_quota.v3.RateLimitQuotaUsageReports",
    "RateLimitQuotaResponse": "envoy.service.rate_limit_quota.v3.RateLimitQuotaResponse",
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
