"""``ratewarden serve`` as a process: it starts, answers, logs JSON, drains on
SIGTERM, and refuses what it cannot do well."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.redis_server import RedisServer
from tests.server.process import RATEWARDEN, serving

DELAY_RULES = textwrap.dedent("""
    rules:
      - name: export
        rate: 1/second
        algorithm: gcra
        action: delay
        max_wait: 5
        match: {paths: /export}
""")


def test_serve_answers_and_stops_cleanly_on_sigterm(rules_file: Path, tmp_path: Path) -> None:
    with serving("--config", str(rules_file), tmp=tmp_path) as served:
        with httpx.Client(base_url=served.url) as client:
            assert client.get("/healthz").json() == {"status": "ok"}
            body = {"attributes": {"path": "/api/login", "method": "POST", "ip": "1.2.3.4"}}
            answers = [client.post("/v1/check", json=body).json() for _ in range(4)]
            assert [a["allowed"] for a in answers] == [True, True, True, False]
        assert served.terminate() == 0
    logs = [json.loads(line) for line in served.stderr.read_text().splitlines() if line]
    messages = [entry["message"] for entry in logs]
    assert any(m.startswith("serving: HTTP on") for m in messages)
    assert any(m.startswith("draining") for m in messages)
    assert messages[-1] == "stopped"
    assert {"time", "level", "logger", "message", "pid"} <= set(logs[0])


def test_sigterm_lets_requests_in_flight_finish(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(DELAY_RULES)
    with serving("--config", str(rules), "--drain", "10", tmp=tmp_path) as served:
        headers = {"X-Original-URI": "/export"}
        with httpx.Client(base_url=served.url, timeout=10) as client:
            assert client.get("/auth", headers=headers).status_code == 200
            answers: list[int] = []
            held = threading.Thread(
                target=lambda: answers.append(client.get("/auth", headers=headers).status_code)
            )
            started = time.monotonic()
            held.start()  # the gcra delay holds this one for about a second
            time.sleep(0.3)
            code = served.terminate()
            held.join()
        assert answers == [200]
        assert time.monotonic() - started >= 0.9
        assert code == 0


def test_workers_with_the_memory_store_are_refused_loudly(rules_file: Path) -> None:
    done = subprocess.run(
        [str(RATEWARDEN), "serve", "--config", str(rules_file), "--workers", "2"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 2  # the CLI's exit code for what it was told to do
    assert "--workers 2 with the memory store" in done.stderr
    assert "2 times the rate" in done.stderr


def test_bad_options_are_errors_not_tracebacks(rules_file: Path, tmp_path: Path) -> None:
    for args, words in [
        (["--http", "nonsense"], "--http takes HOST:PORT"),
        (["--http", "off", "--grpc", "off"], "nothing to serve"),
        (["--store", "mongodb://x"], "--store takes 'memory' or a Redis URL"),
        (["--config", str(tmp_path / "missing.yaml")], "missing.yaml"),
        (["--token-file", str(tmp_path / "no-token")], "--token-file"),
        (["--grpc-cert", str(tmp_path / "c"), "--grpc-key", str(tmp_path / "k")], "--grpc-cert"),
        (["--drain", "nan"], "--drain must be a finite number"),
        (["--config-reload-interval", "-1"], "--config-reload-interval must be a finite"),
        (["--max-connections", "0"], "--max-connections must be an integer >= 1, got 0"),
        (["--idle-timeout", "nan"], "--idle-timeout must be a number of seconds > 0"),
        (["--header-timeout", "-1"], "--header-timeout must be a number of seconds > 0"),
        (["--body-timeout", "inf"], "--body-timeout must be a number of seconds > 0"),
        (["--max-header-bytes", "100"], "--max-header-bytes must be >= 1024, got 100"),
        (["--store", "memory://", "--workers", "2"], "with the memory store"),
    ]:
        done = subprocess.run(
            [str(RATEWARDEN), "serve", "--config", str(rules_file), *args],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert done.returncode == 2, (args, done.stderr)
        assert words in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_workers_share_a_redis_store(
    rules_file: Path, tmp_path: Path, redis_single: RedisServer
) -> None:
    with redis_single.client() as client:
        client.flushall()
    args = (
        "--config",
        str(rules_file),
        "--store",
        redis_single.url,
        "--workers",
        "2",
        "--store-timeout",
        "5",
    )  # exactness on a busy machine, not the 50 ms default
    with serving(*args, tmp=tmp_path) as served:
        time.sleep(1.0)  # both workers up
        body = {"attributes": {"path": "/api/login", "method": "POST", "ip": "9.9.9.9"}}
        allowed = []
        for _ in range(8):
            with httpx.Client(base_url=served.url) as client:  # new connections: both workers
                allowed.append(client.post("/v1/check", json=body).json()["allowed"])
        assert allowed == [True] * 3 + [False] * 5
        # Both workers answered: each one's /metrics counts the checks it served, and
        # the kernel spreads new connections over them (all 40 on one worker: 2^-39).
        other = {"attributes": {"path": "/other", "method": "GET", "ip": "7.7.7.7"}}
        for _ in range(32):
            with httpx.Client(base_url=served.url) as client:
                client.post("/v1/check", json=other)
        served_by = set()
        count = re.compile(r'ratewarden_request_duration_seconds_count\{endpoint="check"\} (\S+)')
        for _ in range(40):
            with httpx.Client(base_url=served.url) as client:
                text = client.get("/metrics").text
            found = count.search(text)
            assert found, text[:2000]
            served_by.add(int(float(found.group(1))))
        # every count seen is one worker's: none served all 40, none served none (two
        # workers may well have served 20 each)
        assert all(0 < count < 40 for count in served_by), served_by
        # gRPC too: every worker listens on the port, with the same counters
        codes = [grpc_check(served.grpc, "8.8.8.8") for _ in range(5)]
        assert codes == [1, 1, 1, 2, 2]
        assert served.terminate() == 0


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()]


def _alive(pid: int) -> bool:
    try:  # a zombie is gone too: it only waits to be reaped
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_workers_stop_when_their_parent_is_killed(
    rules_file: Path, tmp_path: Path, redis_single: RedisServer
) -> None:
    """SIGKILL forwards nothing: the workers see their parent gone and stop, as on
    SIGTERM, and leave the ports free for the next server."""
    args = ("--config", str(rules_file), "--store", redis_single.url, "--workers", "2")
    with serving(*args, tmp=tmp_path) as served:
        workers = _two_workers(served.process.pid)
        served.process.kill()
        served.process.wait()
        deadline = time.monotonic() + 10  # a second's poll, then the drain
        try:
            while alive := [pid for pid in workers if _alive(pid)]:
                assert time.monotonic() < deadline, f"workers {alive} outlived their parent"
                time.sleep(0.05)
        finally:  # none is left behind by a failure
            for pid in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        with socket.socket() as sock:  # the port is free again
            sock.bind(("127.0.0.1", served.http))
    log = served.stderr.read_text()
    assert log.count("is gone: this worker stops") == 2, log


def _two_workers(pid: int) -> list[int]:
    deadline = time.monotonic() + 10
    while len(workers := _children(pid)) < 2:
        assert time.monotonic() < deadline, "the two workers did not start"
        time.sleep(0.05)
    return workers


@pytest.mark.slow
def test_a_worker_that_dies_is_replaced(
    rules_file: Path, tmp_path: Path, redis_single: RedisServer
) -> None:
    args = ("--config", str(rules_file), "--store", redis_single.url, "--workers", "2")
    with serving(*args, tmp=tmp_path) as served:
        first = _two_workers(served.process.pid)
        deadline = time.monotonic() + 10
        while served.stderr.read_text().count('"serving: ') < 2:  # both serve
            assert time.monotonic() < deadline, served.stderr.read_text()
            time.sleep(0.05)
        os.kill(first[0], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while True:
            now = _children(served.process.pid)
            if len(now) == 2 and first[0] not in now:
                break
            assert time.monotonic() < deadline, f"not replaced: {now}"
            time.sleep(0.05)
        assert first[1] in now  # the other one was left alone
        body = {"attributes": {"path": "/other", "method": "GET", "ip": "6.6.6.6"}}
        for _ in range(8):  # new connections: both workers answer
            with httpx.Client(base_url=served.url) as client:
                assert client.post("/v1/check", json=body).status_code == 200
        assert served.terminate() == 0
    log = served.stderr.read_text()
    assert f"a worker (pid {first[0]}) died (killed by SIGKILL): starting another" in log, log


@pytest.mark.slow
def test_a_worker_that_cannot_start_stops_serve_with_its_code(
    rules_file: Path, tmp_path: Path, redis_single: RedisServer
) -> None:
    """The gRPC port taken by a socket without SO_REUSEPORT: no worker can listen."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [str(RATEWARDEN), "serve", "--config", str(rules_file), "--store",
             redis_single.url, "--workers", "2", "--http", "127.0.0.1:0",
             "--grpc", f"127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr  # as `serve` alone exits
    assert "ended (exit code 2) before it served: stopping the others" in done.stderr
    assert "gRPC cannot listen on" in done.stderr
    assert "Traceback" not in done.stderr
    assert "starting another" not in done.stderr


def grpc_check(port: int, ip: str, token: str | None = None) -> int:
    """One ShouldRateLimit on a new connection (so the kernel picks a worker)."""
    import grpc  # noqa: PLC0415

    from ratewarden.server._grpc_server import METHOD, messages  # noqa: PLC0415

    m = messages()
    request = m["RateLimitRequest"](domain="ratewarden")
    entries = request.descriptors.add().entries
    for key, value in (("remote_address", ip), ("path", "/api/login"), ("method", "POST")):
        entries.add(key=key, value=value)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        metadata = () if token is None else (("authorization", f"Bearer {token}"),)
        payload = call(request.SerializeToString(), timeout=10, metadata=metadata)
        answer = m["RateLimitResponse"].FromString(payload)
    return int(answer.overall_code)


def test_a_second_server_on_a_taken_grpc_port_fails(rules_file: Path, tmp_path: Path) -> None:
    with serving("--config", str(rules_file), tmp=tmp_path) as served:
        done = subprocess.run(
            [str(RATEWARDEN), "serve", "--config", str(rules_file), "--http", "127.0.0.1:0",
             "--grpc", f"127.0.0.1:{served.grpc}"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert f"gRPC cannot listen on 127.0.0.1:{served.grpc}: Address already in use" in (
            done.stderr
        )
        assert "Traceback" not in done.stderr
        served.terminate()


PER_IP = textwrap.dedent("""
    rules:
      - name: per-ip
        rate: 5/minute
        algorithm: sliding_window_log  # no minute's edge among the checks (the wall clock)
        by: ip
""")


@pytest.mark.parametrize("trusted", [False, True])
def test_auth_believes_x_forwarded_for_only_from_trusted_proxies(
    tmp_path: Path, trusted: bool
) -> None:
    """The rule file decides whom to believe, not the server: from a peer that is
    no trusted proxy, a forged X-Forwarded-For counts against the peer and
    leaves the named address's counter alone."""
    rules = tmp_path / "rules.yaml"
    proxies = "client_ip: {trusted_proxies: [127.0.0.0/8]}\n" if trusted else ""
    rules.write_text(proxies + PER_IP)
    with serving("--config", str(rules), "--grpc", "off", tmp=tmp_path) as served:
        with httpx.Client(base_url=served.url) as client:
            forged = [client.get("/auth", headers={"X-Forwarded-For": f"198.51.100.{n}"})
                      for n in range(8)]  # fmt: skip
            theirs = client.post("/v1/check", json={"attributes": {"ip": "198.51.100.0"}}).json()
            peer = client.post("/v1/check", json={"attributes": {"ip": "127.0.0.1"}}).json()
        served.terminate()
    codes = [answer.status_code for answer in forged]
    if trusted:  # eight clients behind the proxy, one request each
        assert codes == [200] * 8
        assert theirs["remaining"] == 3
        assert peer["remaining"] == 4
    else:  # the peer, eight times
        assert codes == [200] * 5 + [429] * 3
        assert theirs["remaining"] == 4
        assert peer["allowed"] is False


TOKEN = "tok-7f3a9c1e5d-bearer-marker"


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_debug_logs_never_hold_the_bearer_token(
    rules_file: Path, tmp_path: Path, log_format: str
) -> None:
    """hpack logs every header block it decodes at debug: the token with it."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    args = ("--config", str(rules_file), "--token-file", str(token), "--log-level", "debug",
            "--log-format", log_format)  # fmt: skip
    good = {"Authorization": f"Bearer {TOKEN}"}
    with serving(*args, tmp=tmp_path) as served:
        with httpx.Client(base_url=served.url, headers=good) as client:
            assert client.post("/v1/check", json={"attributes": {"user": "u"}}).status_code == 200
            assert client.get("/auth", headers={"X-User": "u"}).status_code == 200
            assert client.get("/v1/check", headers={"X-Token": TOKEN}).status_code == 405
            metrics = client.get("/metrics").text
        with socket.create_connection(("127.0.0.1", served.http), timeout=5) as raw:
            raw.sendall(f"NOT HTTP\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
            assert raw.recv(100).startswith(b"HTTP/1.1 400")
        assert grpc_check(served.grpc, "8.8.4.4", token=TOKEN) == 1
        with pytest.raises(Exception, match="UNAUTHENTICATED"):
            grpc_check(served.grpc, "8.8.4.4", token=TOKEN[::-1])
        assert served.terminate() == 0
    logs = served.stderr.read_text()
    assert "an invalid request from" in logs  # a debug record: debug is on
    assert TOKEN not in logs
    assert TOKEN not in metrics


def test_setup_logging_keeps_libraries_that_log_headers_quiet(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from ratewarden.server._logging import setup_logging  # noqa: PLC0415

    names = ("", "ratewarden", "hpack", "h2")
    saved = [(logging.getLogger(n), logging.getLogger(n).level) for n in names]
    handlers = logging.getLogger().handlers[:]
    try:
        setup_logging("text", "debug", secrets=(TOKEN, "short"))
        logging.getLogger("hpack").debug("Decoded %s", (b"authorization", f"Bearer {TOKEN}"))
        logging.getLogger("h2").debug("headers: %s", TOKEN)
        logging.getLogger("some.library").debug("debug of a library: %s", TOKEN)
        logging.getLogger("ratewarden.server").debug("ours at debug")
        logging.getLogger("some.library").warning("a library logs it after all: %s", TOKEN)
        logging.getLogger("some.library").warning("a short secret stays: short")
    finally:
        logging.getLogger().handlers[:] = handlers
        for logger, level in saved:
            logger.setLevel(level)
    err = capsys.readouterr().err
    assert "ours at debug" in err
    assert "Decoded" not in err
    assert "headers:" not in err
    assert "debug of a library" not in err
    assert "a library logs it after all: [redacted]" in err
    assert "a short secret stays: short" in err  # blanking "short" would blank words
    assert TOKEN not in err


def test_the_connection_cap_fits_the_open_file_limit(rules_file: Path, tmp_path: Path) -> None:
    """Raised to the hard limit at start; the cap lowered, with a log line, when
    both listeners' connections would not fit under it even then."""

    def under(soft: int, hard: int) -> list[str]:
        return ["sh", "-c", f'ulimit -Sn {soft} && ulimit -Hn {hard} && exec "$0" "$@"',
                str(RATEWARDEN), "serve", "--config", str(rules_file), "--http", "127.0.0.1:0",
                "--grpc", "127.0.0.1:0"]  # fmt: skip

    with subprocess.Popen(under(512, 1024), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as process:  # fmt: skip
        assert process.stdout is not None
        assert "HTTP on http://" in process.stdout.readline()
        limits = Path(f"/proc/{process.pid}/limits").read_text()
        process.terminate()
        _, stderr = process.communicate(timeout=30)
    assert re.search(r"Max open files\s+1024\s+1024", limits)  # soft raised to hard
    assert "the default --max-connections lowered from 10000 to 384 a listener" in stderr
    # under 20000 files, the default fitted to 9872 a listener is no news at start
    with subprocess.Popen(under(20000, 20000), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as process:  # fmt: skip
        assert process.stdout is not None
        assert "HTTP on http://" in process.stdout.readline()
        process.terminate()
        _, stderr = process.communicate(timeout=30)
    assert "lowered" not in stderr
    done = subprocess.run(under(200, 200), capture_output=True, text=True, timeout=30,
                          check=False)  # fmt: skip
    assert done.returncode == 2
    assert "the process may open only 200 files (ulimit -n): too few to serve" in done.stderr
    assert "Traceback" not in done.stderr


def test_instances_reach_the_store_and_bad_ones_are_refused(redis_single: RedisServer) -> None:
    from ratewarden import ConfigurationError  # noqa: PLC0415
    from ratewarden.server._serve_options import (  # noqa: PLC0415
        ServeOptions,
        check_options,
        make_store,
    )

    with pytest.raises(ConfigurationError, match="--instances"):
        check_options(ServeOptions(config="rules.yaml", store=redis_single.url, instances=0))
    store = make_store(
        redis_single.url, ServeOptions(config="rules.yaml", store=redis_single.url, workers=3)
    )
    assert store._fallback.count() == 3  # type: ignore[attr-defined]  # default: --workers
    store = make_store(
        redis_single.url, ServeOptions(config="rules.yaml", store=redis_single.url, instances=12)
    )
    assert store._fallback.count() == 12  # type: ignore[attr-defined]
