"""The concurrency rules' slots of a request the middleware serves.

A rule file with ``concurrency`` rules bounds the requests in flight: the
middleware then asks the engine to ``acquire`` (a check that also takes a slot
of each concurrency rule the request meets) instead of to ``check``, holds the
slots for the request's whole duration and releases them when it ends, however
it ends. Without such rules it checks, as ever, and takes nothing.

A slot refused answers as a rate refused does: the rule's status (429 unless it
says 503) with Retry-After, the time until the earliest slot's lease ends. A
``delay`` rule's request waits for a slot up to the rule's ``max_wait``.

A release that finds its slots gone (the request outlived the rule's ``lease``
and the slot was reclaimed) is logged: the response is the client's already.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..stores import AsyncMemoryStore, MemoryStore

if TYPE_CHECKING:
    from ..rules import Admission, AsyncRuleEngine, RuleEngine, RuleSet

__all__ = ["aadmit", "admit", "agive_back", "give_back", "holds_slots"]

log = logging.getLogger("ratewarden.integrations")

# what a sync engine's slots are released by cannot await: a task that must
# outlive its request's cancellation is kept here until it is done
_releasing: set[asyncio.Task[None]] = set()


def holds_slots(engine: RuleEngine | AsyncRuleEngine) -> bool:
    """Whether the rules in force bound requests in flight (then every request
    is admitted with ``acquire``, which takes no slot where no such rule applies)."""
    return bool(engine.ruleset.concurrent)


@functools.lru_cache(maxsize=4)  # the rule sets in force lately: one, but for reloads
def _waits(ruleset: RuleSet) -> bool:
    """Whether a rule in force can make a request wait (for a slot, or out a rate)."""
    return any(rule.action in ("delay", "queue") for rule in ruleset.rules)


async def aadmit(
    engine: RuleEngine | AsyncRuleEngine, attributes: Mapping[str, object], identified: bool
) -> Admission:
    """The engine's admission of a request, waits waited out, without blocking
    the event loop: an `AsyncRuleEngine` is awaited; a sync `RuleEngine` runs
    inline on a `MemoryStore` when no rule in force can make it wait, else on a
    worker thread (where it waits for a slot, or out a delay: a sync engine's
    waiter holds that thread)."""
    from ..rules import AsyncRuleEngine  # noqa: PLC0415 (an engine imported it)

    if isinstance(engine, AsyncRuleEngine):
        return await engine.aacquire(attributes, wait=True, identified=identified)
    admit_ = functools.partial(engine.acquire, attributes, wait=True, identified=identified)
    if isinstance(engine.store, MemoryStore) and not _waits(engine.ruleset):
        return admit_()
    return await asyncio.to_thread(admit_)


def admit(engine: RuleEngine, attributes: Mapping[str, object], identified: bool) -> Admission:
    """The sync engine's admission, waits waited out on this thread."""
    return engine.acquire(attributes, wait=True, identified=identified)


async def agive_back(engine: RuleEngine | AsyncRuleEngine, token: str) -> None:
    """Release the slots of ``token``, even when the request's task is being
    cancelled: the release runs in a task of its own, which a cancellation of
    this one leaves to finish. A memory store's release never suspends, so no
    cancellation can cut it short: it runs here, without the task's loop turn."""
    if isinstance(engine.store, MemoryStore | AsyncMemoryStore):
        await _release(engine, token)
        return
    task = asyncio.ensure_future(_release(engine, token))
    _releasing.add(task)
    task.add_done_callback(_releasing.discard)
    await asyncio.shield(task)


async def _release(engine: RuleEngine | AsyncRuleEngine, token: str) -> None:
    from ..rules import AsyncRuleEngine  # noqa: PLC0415

    try:
        if isinstance(engine, AsyncRuleEngine):
            await engine.arelease(token)
        elif isinstance(engine.store, MemoryStore):
            engine.release(token)
        else:
            await asyncio.to_thread(engine.release, token)
    except Exception as exc:
        _failed(exc)


def give_back(engine: RuleEngine, token: str) -> None:
    """Release the slots of ``token`` (a sync engine's); a failure is logged."""
    try:
        engine.release(token)
    except Exception as exc:
        _failed(exc)


def _failed(exc: Exception) -> None:
    from ..rules import LeaseGone  # noqa: PLC0415

    if isinstance(exc, LeaseGone):  # the response is sent: tell the log, not the client
        log.warning("%s (the request outlived its rule's lease)", exc)
    else:
        log.error("releasing the request's slots failed; they end with their lease", exc_info=exc)
