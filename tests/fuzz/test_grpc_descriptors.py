"""ShouldRateLimit on a real ``ratewarden serve`` under descriptor shapes no
well-behaved Envoy sends: none, a thousand entries, 64 kB values, keys and
values that are not UTF-8, fields the message does not have, messages cut
short. The bytes are written by hand (`tests.fuzz.protobuf`), since protobuf's
classes refuse to build some of them. Every call is answered with a decision
or INVALID_ARGUMENT and a reason, and the server logs no error."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from hypothesis import event, given

from tests.fuzz import strategies as fz
from tests.fuzz.protobuf import Descriptor, Request, fields
from tests.fuzz.served import assert_clean_log, log_size, served_with_rules
from tests.server.process import Served

METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
OK, OVER_LIMIT = 1, 2


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with served_with_rules(tmp_path_factory.mktemp("fuzz-grpc")) as served:
        yield served


@pytest.fixture(scope="module")
def rpc(served: Served) -> Iterator[grpc.UnaryUnaryMultiCallable]:
    with grpc.insecure_channel(f"127.0.0.1:{served.grpc}") as channel:
        # raw bytes both ways: no serializer to refuse what we send or fix what we get
        yield channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)


def ask(rpc: grpc.UnaryUnaryMultiCallable, data: bytes) -> tuple[grpc.StatusCode, object]:
    """(OK, the response's fields) or (the error's code, its details)."""
    try:
        answer = rpc(data, timeout=20)
    except grpc.RpcError as exc:
        return exc.code(), exc.details()
    return grpc.StatusCode.OK, fields(answer)


def check_answer(code: grpc.StatusCode, answer: object, descriptors: int | None) -> None:
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED):
        assert isinstance(answer, str), answer
        assert answer.strip(), f"{code.name} without a reason"
        return
    assert code == grpc.StatusCode.OK, (code, answer)
    assert isinstance(answer, dict)
    assert answer.get(1) in ([OK], [OVER_LIMIT]), answer  # overall_code
    if descriptors is not None:
        assert len(answer.get(2, [])) == descriptors, answer  # one status per descriptor


@given(request=fz.rls_requests())
def test_random_requests(
    rpc: grpc.UnaryUnaryMultiCallable, served: Served, request: tuple[bytes, int | None]
) -> None:
    data, descriptors = request
    mark = log_size(served)
    code, answer = ask(rpc, data)
    event(code.name)
    check_answer(code, answer, descriptors)
    assert_clean_log(served, since=mark)


LOGIN = [(b"remote_address", b"203.0.113.9"), (b"path", b"/api/login"), (b"method", b"POST")]
BIG = 64 * 1024


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        (Request(b"ratewarden"), "INVALID_ARGUMENT"),
        (Request(b"edge"), "INVALID_ARGUMENT"),
        (Request(b"ratewarden", [Descriptor([])]), "INVALID_ARGUMENT"),
        (Request(b"ratewarden", [Descriptor([(b"user", b"u")] * 1000)]), "INVALID_ARGUMENT"),
        (Request(b"edge", [Descriptor([(b"remote_address", b"10.0.0.1")])] * 1000),
         "INVALID_ARGUMENT"),
        (Request(b"ratewarden", [Descriptor([(b"user", b"v" * BIG)])]), "OK"),
        (Request(b"ratewarden", [Descriptor([(b"k" * BIG, b"v")])]), "OK"),
        (Request(b"edge", [Descriptor([(b"remote_address", bytes([n]) * BIG)])
                           for n in range(97, 97 + 3)]), "OK"),
        # over --max-stream-bytes (256 KiB): refused before it is read
        (Request(b"edge", [Descriptor([(b"remote_address", bytes([n]) * BIG)])
                           for n in range(97, 97 + 26)]), "RESOURCE_EXHAUSTED"),
        (Request(b"ratewarden", [Descriptor([(b"user", b"\xff\xfe")])]), "INVALID_ARGUMENT"),
        (Request(b"ratewarden", [Descriptor([(b"\xc3", b"u")])]), "INVALID_ARGUMENT"),
        (Request(b"edge", [Descriptor([(b"remote_address", b"\xed\xa0\x80")])]),
         "INVALID_ARGUMENT"),
        (Request(b"\xff", [Descriptor(LOGIN)]), "INVALID_ARGUMENT"),
        (Request(b"ratewarden", [Descriptor(LOGIN, hits_addend=2**64 - 1)]), "INVALID_ARGUMENT"),
        (Request(b"ratewarden", [Descriptor(LOGIN, hits_addend=0)]), "OK"),
        (Request(b"ratewarden", [Descriptor(LOGIN, override=(2**32 - 1, 99))]), "OK"),
        (Request(b"edge", [Descriptor([(b"path", b"/free")])], extra=b"\xff\xff\xff"),
         "INVALID_ARGUMENT"),
    ],
    ids=["no-descriptor", "no-descriptor-edge", "no-entry", "1000-entries", "1000-descriptors",
         "64kB-value", "64kB-key", "3x64kB-edge", "26x64kB-edge", "value-not-utf8", "key-not-utf8",
         "surrogate-edge", "domain-not-utf8", "hits-addend-2**64-1", "hits-addend-0",
         "limit-override", "garbage-after"],
)  # fmt: skip
def test_descriptor_shapes(
    rpc: grpc.UnaryUnaryMultiCallable, served: Served, request_: Request, expected: str
) -> None:
    mark = log_size(served)
    code, answer = ask(rpc, request_.encode())
    assert code.name == expected, (code, answer)
    check_answer(code, answer, len(request_.descriptors))
    assert_clean_log(served, since=mark)
