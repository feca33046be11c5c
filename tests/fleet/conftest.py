"""The fleet tests' fixtures on a real Redis: a client of the test's server and a
fresh resource name."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from tests.redis_server import RedisServer


@pytest.fixture
def client(redis_single: RedisServer) -> Iterator[redis.Redis]:
    with redis_single.client() as c:
        yield c


@pytest.fixture
def name() -> str:
    return f"q-{uuid.uuid4().hex[:10]}"
