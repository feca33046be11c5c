"""examples/rlqs/run.py as a reader runs it: ratewarden, three Envoys and an
upstream it starts itself, and the per-second table it prints."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.system.conftest import envoy_binary
from tests.system.rlqs_harness import ROOT


def test_the_example_shows_the_quiet_envoys_served_and_the_total_held() -> None:
    env = {**os.environ, "ENVOY": envoy_binary()}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "rlqs" / "run.py"), "--seconds", "9"],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines()[1:10]]
    for second, upstream, *cells in rows:
        assert int(upstream) <= 204, done.stdout  # never more than 2% over the 200
        if int(second) >= 6:  # after Envoy's second round of reports (5 s apart)
            assert int(upstream) >= 180, done.stdout
            assert [cell.split("/")[1] for cell in cells[1:]] == ["0", "0"], done.stdout
