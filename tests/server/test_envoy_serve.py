"""``ratewarden serve --envoy-config DIR`` as a real process: the directory is
loaded, watched and reloaded; bad envoy input is a clear error, never a traceback."""

from __future__ import annotations

import signal
import subprocess
import textwrap
import time
from pathlib import Path

import httpx

from tests.server.process import RATEWARDEN, serving

EDGE = textwrap.dedent("""
    domain: edge
    descriptors:
      - key: user
        rate_limit: {{unit: day, requests_per_unit: {n}}}
""")


def check(client: httpx.Client, user: str) -> bool:
    body = {"domain": "edge", "descriptors": [{"entries": [{"key": "user", "value": user}]}]}
    answer = client.post("/v1/check", json=body)
    assert answer.status_code == 200, answer.text
    return bool(answer.json()["allowed"])


def test_a_config_directory_is_watched(rules_file: Path, tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "edge.yaml").write_text(EDGE.format(n=1))
    args = ["--config", str(rules_file), "--envoy-config", str(config),
            "--envoy-reload-interval", "0.1"]  # fmt: skip
    with serving(*args, tmp=tmp_path) as served, httpx.Client(base_url=served.url) as client:

        def wait_for_log(words: str) -> None:
            deadline = time.monotonic() + 10  # waiting for the watcher, not a clock edge
            while words not in served.stderr.read_text():
                assert time.monotonic() < deadline, served.stderr.read_text()
                time.sleep(0.05)

        assert [check(client, "a") for _ in range(2)] == [True, False]
        (config / "edge.yaml").write_text(EDGE.format(n=3))
        wait_for_log("envoy config reloaded")
        assert [check(client, "b") for _ in range(4)] == [True, True, True, False]
        (config / "broken.yaml").write_text("domain: edge\ndescriptors: [oops]\n")
        wait_for_log("not reloaded")
        assert [check(client, "c") for _ in range(4)] == [True, True, True, False]
        assert served.terminate() == 0
    log = served.stderr.read_text()
    assert "yaml file contains list of type other than map: oops" in log
    assert "Traceback" not in log


def test_bad_envoy_input_is_an_error_not_a_traceback(rules_file: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight}\n")
    for args, words in [
        (["--envoy-config", str(tmp_path / "missing")], "no such file or directory"),
        (["--envoy-config", str(bad)], "invalid rate limit unit 'fortnight'"),
        (["--near-limit-ratio", "2"], "--near-limit-ratio must be from 0 to 1"),
        (["--envoy-reload-interval", "-1"], "--envoy-reload-interval must be >= 0"),
    ]:
        done = subprocess.run(
            [str(RATEWARDEN), "serve", "--config", str(rules_file), *args],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert done.returncode == 2, (args, done.stderr)  # a usage error
        assert words in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr


def test_without_a_rule_file_a_reload_loads_the_envoy_files(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "edge.yaml").write_text(EDGE.format(n=1))
    # the watcher off: only SIGHUP and POST /v1/reload load the files again
    args = ["--envoy-config", str(config), "--envoy-reload-interval", "0"]
    with serving(*args, tmp=tmp_path) as served, httpx.Client(base_url=served.url) as client:
        assert [check(client, "a") for _ in range(2)] == [True, False]
        (config / "edge.yaml").write_text(EDGE.format(n=3))
        reloaded = client.post("/v1/reload")
        assert reloaded.status_code == 200, reloaded.text
        answer = reloaded.json()
        assert answer["loaded"] == ["envoy"]
        assert answer["envoy_domains"] == ["edge"]
        assert [check(client, "b") for _ in range(4)] == [True, True, True, False]

        (config / "edge.yaml").write_text(EDGE.format(n=5))
        served.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10  # waiting for the reload to run, not a clock edge
        while served.stderr.read_text().count("envoy config reloaded") < 2:
            assert time.monotonic() < deadline, served.stderr.read_text()
            time.sleep(0.05)
        assert [check(client, "c") for _ in range(6)] == [True] * 5 + [False]
        assert served.terminate() == 0
    log = served.stderr.read_text()
    assert "no file to reload" not in log
    assert "Traceback" not in log
