"""A killed Envoy's share moves to the Envoys still running within its lease:
ratewarden sees the stream end, waits for the dead proxy's last assignment to
end (it could still spend it until then), and sends the others more. Judged by
what the upstream receives each second."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tests.server.process import serving
from tests.system.rlqs_harness import RLQS_CONFIG, ROOT, Upstream, envoys, run_load

LIMIT = 200
LEASE = 12  # the example's entry leaves the lease at its default


def test_a_killed_envoys_share_moves_to_the_others_within_its_lease(tmp_path: Path) -> None:
    rules = ROOT / "examples" / "rlqs" / "rules.yaml"  # 200/second per tenant bucket
    # two busy Envoys and a third that is killed: the busy ones want more than
    # they get, so the freed share shows at the upstream as soon as it moves
    rates = [150.0, 150.0, 60.0]
    kill_after = 7.0  # past the first round of reports (5 s): the shares are set
    with (
        serving("--config", str(rules), tmp=tmp_path) as served,
        Upstream(tmp_path) as upstream,
        envoys(3, RLQS_CONFIG, upstream=upstream.port, grpc=served.grpc, tmp=tmp_path) as gws,
    ):
        killed_at: list[float] = []

        def kill() -> None:
            killed_at.append(time.time())
            gws[2].process.kill()

        timer = threading.Timer(kill_after + 1.0, kill)  # the load starts on the next second
        timer.start()
        try:
            run_load([gw.port for gw in gws], rates, kill_after + LEASE + 3,
                     headers=[{"x-tenant": "acme"}] * 3)  # fmt: skip
        finally:
            timer.cancel()
        time.sleep(0.5)
        counts = upstream.counts()
        served.terminate()
    assert killed_at, "the Envoy was not killed"
    killed = int(killed_at[0])
    before = [counts.get(s, 0) for s in range(killed - 4, killed)]
    after = {s - killed: counts.get(s, 0) for s in range(killed + 1, killed + LEASE + 2)}
    said = f"before the kill {before}, after it (second: count) {after}"
    # while all three run, the upstream gets about the total and never more
    assert all(180 <= n <= LIMIT * 1.02 for n in before), said
    # the dead proxy's share comes back to the busy two within the lease...
    back = [s for s, n in after.items() if n >= 180]
    assert back, said
    assert back[0] <= LEASE, said
    # ... and from then on the total holds, never passed by more than 2%
    assert all(n <= LIMIT * 1.02 for n in after.values()), said
    assert all(n >= 180 for s, n in after.items() if s > back[0]), said
