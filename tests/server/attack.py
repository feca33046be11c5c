"""What the attack tests against a real ``ratewarden serve`` share: a service
with one rule, warmed up, that must stop cleanly after the attack."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.server.h2.h2_attacks import legit_check, rls_request
from tests.server.process import Served, serving
from tests.server.test_http_hostile import Legitimate

RULES = textwrap.dedent("""
    rules:
      - name: per-user
        rate: 1000000/minute
        by: user
""")
GRPC_CHECK = rls_request(b"ratewarden", b"user", b"legitimate")


@contextmanager
def service(tmp: Path, *options: str) -> Iterator[Served]:
    rules = tmp / "rules.yaml"
    rules.write_text(RULES)
    with serving("--config", str(rules), *options, tmp=tmp) as served:
        Legitimate(served.http).check()  # warm: the first checks import and compile
        legit_check(served.grpc, b"", GRPC_CHECK)
        yield served
        assert served.terminate() == 0
