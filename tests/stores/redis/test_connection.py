"""What `connect` says about a URL it cannot use: never the password in it."""

from __future__ import annotations

import pytest

from ratewarden import ConfigurationError, StoreUnavailable
from ratewarden.stores.redis.connection import connect
from tests.redis_server import free_port

SECRET = "s3cret-pw"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"redis://:{SECRET}@host:notaport/0", "'redis://***@host:notaport/0'"),
        (f"redis://user:{SECRET}@host:notaport/0", "'redis://***@host:notaport/0'"),
        (f"http://user:{SECRET}@host:1/0", "'http://***@host:1/0'"),
        # the error quotes the node, credentials and all
        (f"redis+cluster://user:{SECRET}@host", "got '***@host'"),
        (f"redis+sentinel://user:{SECRET}@host:1", "'redis+sentinel://***@host:1'"),
        (f"redis://host:1/0?password={SECRET}&socket_timeout=x", "password=***&"),
    ],
)
def test_a_bad_url_is_reported_without_its_password(url: str, shown: str) -> None:
    with pytest.raises(ConfigurationError, match="bad Redis URL") as raised:
        connect(url, 1)
    assert SECRET not in str(raised.value)
    assert shown in str(raised.value)


def test_an_unreachable_url_is_reported_without_its_password() -> None:
    url = f"redis+cluster://user:{SECRET}@127.0.0.1:{free_port()}"
    with pytest.raises(StoreUnavailable, match="cannot reach") as raised:
        connect(url, 1)
    assert SECRET not in str(raised.value)
    assert "'redis+cluster://***@127.0.0.1:" in str(raised.value)


def test_a_url_without_a_password_is_shown_as_it_is() -> None:
    with pytest.raises(ConfigurationError) as raised:
        connect("redis://host:x/0?db=1", 1)
    assert str(raised.value) == (
        "bad Redis URL 'redis://host:x/0?db=1': Port could not be cast to integer value as 'x'"
    )
