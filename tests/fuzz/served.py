"""``ratewarden serve`` for the fuzz tests that need the real server, and what
its log may not say."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.server.conftest import ENVOY, RULES
from tests.server.process import Served, serving

# A traceback, or a handled error logged as one ("gRPC method ... failed",
# the HTTP server's "the app raised", logged with its traceback).
_BAD = ("Traceback", "failed", "the app raised", '"level": "error"',
        '"level": "critical"')  # fmt: skip


def log_problems(served: Served, since: int = 0) -> list[str]:
    """The bad lines the server logged after byte ``since`` of its log."""
    with served.stderr.open("rb") as log:
        log.seek(since)
        lines = log.read().decode("utf-8", "replace").splitlines()
    return [line for line in lines if any(word in line for word in _BAD)]


def log_size(served: Served) -> int:
    return served.stderr.stat().st_size


def assert_clean_log(served: Served, since: int = 0) -> None:
    problems = log_problems(served, since)
    assert not problems, "the server logged:\n" + "\n".join(problems[:5])


@contextmanager
def served_with_rules(tmp: Path, *args: str) -> Iterator[Served]:
    """The service on the server tests' rules and envoy domain ``edge``."""
    (tmp / "rules.yaml").write_text(RULES)
    (tmp / "edge.yaml").write_text(ENVOY)
    with serving("--config", str(tmp / "rules.yaml"), "--envoy-config", str(tmp / "edge.yaml"),
                 *args, tmp=tmp) as served:  # fmt: skip
        yield served
        served.terminate()
        assert_clean_log(served)
