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
- nothing leaks: connections (the client's own per Redis port, the proxy's and
  Redis's counts), asyncio tasks, file descriptors, memory (tracemalloc, and
  the objects the garbage collector tracks).

A shared virtual machine freezes now and then (every core, tens of milliseconds): a decision in
flight then may be slow, or time out, whatever the store does. A decision that
was in flight during such a stall of the test process is excused from the time
bound, and from being healthy where it should have been, and counted
(tests/faults/load.py, `Stalls`); the policies, the fault's effect and what
Redis counted are never excused. A check that failed while the servers (Redis,
the fault proxy) waited 10 ms or more for a core (a busy machine, not the store)
is excused from being healthy too, never from the time bound, which the client
keeps alone.

Each test prints its figures on a line starting with ``FAULT`` (``pytest -s``).
tests/faults/test_time_bound.py pins down what the load does not: the timeout
bounds a whole decision (a check queued behind a hung batch, a reconnection and
a script reload over a slow link). tests/faults/test_soak_short.py runs
bench/soak.py for 20 seconds.
"""
