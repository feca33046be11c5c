"""A ``ratewarden`` command whose reader closes the pipe early (``ratewarden
quota list | head -1``) ends quietly: no traceback, no "Broken pipe" line, exit
code 141 as a shell reports for a command that SIGPIPE ended.

The real command runs with its stdout a pipe whose reading end is closed before
it starts, so that every write fails, whatever the timing; and once more
through ``head -1``, as a person runs it."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from ratewarden.fleet import QuotaConfig, set_quota
from tests.redis_server import RedisServer
from tests.server.process import RATEWARDEN

ROOT = Path(__file__).resolve().parents[2]
RULES = str(ROOT / "examples" / "rules.yaml")
CLOSED_PIPE = 141


def closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """``ratewarden ARGS`` writing into a pipe nobody reads."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([str(RATEWARDEN), *args], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=120, check=False)  # fmt: skip
    finally:
        os.close(write)


@pytest.mark.parametrize(
    "args",
    [
        ["simulate", "--seconds", "2"],
        ["check-config", RULES],
        ["check-config", RULES, "--json"],
        ["explain", RULES, "method=POST", "path=/api/login", "ip=10.0.0.5"],
        ["bench", "--seconds", "0.1"],
    ],
    ids=lambda args: " ".join(args).replace(RULES, "rules.yaml"),
)
def test_a_closed_pipe_ends_the_command_quietly(args: list[str]) -> None:
    done = closed_pipe(*args)
    assert done.stderr == ""
    assert done.returncode == CLOSED_PIPE


def test_quota_list_into_a_closed_pipe(redis_single: RedisServer) -> None:
    with redis_single.client() as client:
        for n in range(3):
            set_quota(client, f"pipe-{n}", QuotaConfig("10/second"))
    done = closed_pipe("quota", "list", "--store", redis_single.url)
    assert done.stderr == ""
    assert done.returncode == CLOSED_PIPE


@pytest.mark.skipif(shutil.which("head") is None, reason="needs head")
def test_through_head() -> None:
    """As a person runs it: the first line shown, nothing on stderr. (Whether the
    command met the closed pipe depends on timing: its exit code is not asserted.)"""
    line = f"{shlex.quote(str(RATEWARDEN))} simulate --seconds 2 | head -1"
    done = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip
    assert len(done.stdout.splitlines()) == 1
    assert done.stderr == ""
