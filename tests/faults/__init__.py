"""Faults between the limiter and Redis, under load, each bounded in time and on
loopback only: added latency, blackholes and connection resets (tests/faults/
proxy.py puts them between the store and Redis), a Redis restart and a hung
Redis, a Redis Cluster master killed and a slot migrated under load; for the sync
`RedisStore`, the `AsyncRedisStore` (which has a connection of its own) and the
cluster store.

For each fault the suite checks (tests/faults/load.py):

- every decision is answered within the store's timeout plus a stated slack;
- while the store cannot decide, the limit's policy answers, marked degraded:
  ``fail_open`` admits, ``fail_closed`` denies;
- the circuit breaker opens during the fault and closes again after it;
- limiting is exact again after recovery, and nothing was admitted beyond what
  Redis counted;
- nothing leaks: connections (the proxy's and Redis's count), asyncio tasks,
  file descriptors, memory (tracemalloc).

Each test prints its figures on a line starting with ``FAULT`` (``pytest -s``).
"""
