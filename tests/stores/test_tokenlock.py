from __future__ import annotations

import threading

from ratewarden import FakeClock, Limiter, MemoryStore
from ratewarden.stores.memory import TokenLock


def test_a_hit_waits_while_another_thread_holds_the_store() -> None:
    store = MemoryStore(clock=FakeClock())
    limiter = Limiter("1/minute", algorithm="fixed_window", store=store)
    store._lock.acquire()  # as if another thread were inside a hit
    results = []
    worker = threading.Thread(target=lambda: results.append(limiter.hit("k")))
    worker.start()
    worker.join(0.05)
    assert worker.is_alive()  # blocked on the token, not racing past it
    assert results == []
    store._lock.release()
    worker.join(5)
    assert not worker.is_alive()
    assert results[0].allowed
    assert not limiter.hit("k").allowed  # exactly one counted


def test_mutual_exclusion_under_preemption() -> None:
    lock = TokenLock()
    counter = [0]

    def work() -> None:
        for _ in range(20_000):
            with lock:
                value = counter[0]
                for _ in range(3):  # backward jumps: the interpreter may switch here
                    pass
                counter[0] = value + 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter[0] == 80_000
    assert repr(lock) == "<TokenLock unlocked>"
