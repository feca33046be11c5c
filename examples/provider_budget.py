"""Obey a provider by what it says remains: no 429, with a local limit far above its own.

    python examples/provider_budget.py

A provider allows 10 requests a second (windows aligned to its clock's seconds)
and says what remains on every answer, in the IETF draft's headers (``RateLimit:
"default";r=7;t=1``, ``RateLimit-Policy``) and the common ones
(``X-RateLimit-Remaining``, ``X-RateLimit-Reset``). Four threads send 40 requests
through an httpx client whose limiter allows 1000 a second: the transport holds
each request back while the provider's budget is spent, until its reset, so the
provider answers every one with 200. Prints the counts, and the busiest second
the provider saw.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import httpx

from ratewarden import Limiter
from ratewarden.integrations.httpx import RateLimitTransport

QUOTA = 10  # the provider's requests a second
REQUESTS = 40


class Provider(BaseHTTPRequestHandler):
    counts: ClassVar[Counter[int]] = Counter()  # answered 200 a second, by its clock
    lock = threading.Lock()

    def do_GET(self) -> None:
        now = time.time()
        second = math.floor(now)
        with self.lock:
            admitted = self.counts[second] < QUOTA
            if admitted:
                self.counts[second] += 1
            remaining = QUOTA - self.counts[second]
        reset = max(1, math.ceil(second + 1 - now))  # whole seconds, rounded up
        self.send_response(200 if admitted else 429)
        self.send_header("RateLimit", f'"default";r={remaining};t={reset}')
        self.send_header("RateLimit-Policy", f'"default";q={QUOTA};w=1')
        self.send_header("X-RateLimit-Limit", str(QUOTA))
        self.send_header("X-RateLimit-Remaining", str(remaining))
        self.send_header("X-RateLimit-Reset", str(reset))
        if not admitted:
            self.send_header("Retry-After", str(reset))
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Provider)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/orders"
    transport = RateLimitTransport(Limiter("1000/second"), max_wait=10.0)
    started = time.monotonic()
    with httpx.Client(transport=transport) as client, ThreadPoolExecutor(4) as pool:
        statuses = Counter(pool.map(lambda _: client.get(url).status_code, range(REQUESTS)))
    took = time.monotonic() - started
    server.shutdown()
    server.server_close()
    print(f"sent {REQUESTS} in {took:.1f} s: {statuses[200]} answered 200, {statuses[429]} 429")
    print(f"the provider's busiest second: {max(Provider.counts.values())} of {QUOTA}")


if __name__ == "__main__":
    main()
