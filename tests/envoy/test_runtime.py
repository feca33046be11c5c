"""``ratewarden serve --envoy-env``: envoyproxy/ratelimit's environment
variables read where they map; flags win; nothing read without the flag."""

from __future__ import annotations

import argparse

import pytest

from ratewarden import ConfigurationError
from ratewarden.envoy._runtime import apply_environment
from ratewarden.server._serve_options import ServeOptions, add_arguments, options_from


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--config", "rules.yaml", *argv])


def options(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], *argv: str) -> ServeOptions:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return options_from(parse(*argv))


PEER = {
    "RUNTIME_ROOT": "/srv/runtime_data/current",
    "RUNTIME_SUBDIRECTORY": "ratelimit",
    "MERGE_DOMAIN_CONFIG": "true",
    "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true",
    "NEAR_LIMIT_RATIO": "0.9",
    "SHADOW_MODE": "false",
    "QUOTA_MODE": "true",
    "RESPONSE_DYNAMIC_METADATA": "1",
    "REDIS_SOCKET_TYPE": "tcp",
    "REDIS_URL": "redis.internal:6380",
    "GRPC_PORT": "8081",
    "PORT": "8080",
    "LOG_LEVEL": "WARN",
}


def test_the_peers_variables_map(monkeypatch: pytest.MonkeyPatch) -> None:
    got = options(monkeypatch, PEER, "--envoy-env")
    assert got.envoy_config == ("/srv/runtime_data/current/ratelimit/config",)
    assert got.envoy.merge
    assert got.envoy.quota_mode
    assert not got.envoy.shadow_mode
    assert not got.envoy.count_denied
    assert got.envoy.dynamic_metadata
    assert got.envoy.near_limit_ratio == 0.9
    assert got.store == "redis://redis.internal:6380"
    assert got.grpc is not None
    assert got.grpc.endswith(":8081")
    assert got.http is not None
    assert got.http.endswith(":8080")
    assert got.log_level == "warning"


def test_without_the_flag_nothing_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    got = options(monkeypatch, PEER)
    assert got.envoy_config == ()
    assert got.store == "memory"
    assert got.envoy.count_denied


def test_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    got = options(
        monkeypatch, PEER, "--envoy-env", "--store", "redis://other:1", "--envoy-config", "/x",
        "--near-limit-ratio", "0.5",
    )  # fmt: skip
    assert got.store == "redis://other:1"
    assert got.envoy_config == ("/x",)
    assert got.envoy.near_limit_ratio == 0.5


@pytest.mark.parametrize(
    ("env", "store"),
    [
        ({"REDIS_URL": "/var/run/redis.sock"}, "unix:///var/run/redis.sock"),
        ({"REDIS_URL": "h:1", "REDIS_SOCKET_TYPE": "tcp", "REDIS_TLS": "true",
          "REDIS_AUTH": "s3cret"}, "rediss://:s3cret@h:1"),
        ({"REDIS_URL": "a:1,b:2", "REDIS_TYPE": "cluster"}, "redis+cluster://a:1,b:2"),
        ({"REDIS_URL": "mymaster,a:1,b:2", "REDIS_TYPE": "sentinel"},
         "redis+sentinel://a:1,b:2/mymaster"),
    ],
)  # fmt: skip
def test_redis_urls(env: dict[str, str], store: str) -> None:
    args = parse("--envoy-env")
    apply_environment(args, parse(), env)
    assert args.store == store


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"SHADOW_MODE": "maybe"}, "$SHADOW_MODE='maybe' is not a boolean"),
        ({"NEAR_LIMIT_RATIO": "lots"}, "is not a number"),
        ({"LOG_LEVEL": "chatty"}, "is not a log level"),
        ({"REDIS_URL": "h:1", "REDIS_TYPE": "ring"}, "single, sentinel or cluster"),
    ],
)
def test_bad_values_are_clear_errors(env: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigurationError, match=words.replace("$", r"\$")):
        apply_environment(parse("--envoy-env"), parse(), env)


def test_a_ratio_out_of_range(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="from 0 to 1"):
        options(monkeypatch, {"NEAR_LIMIT_RATIO": "1.5"}, "--envoy-env")
