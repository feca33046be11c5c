"""How `serve --workers` replaces a worker that dies: each place backs off on its
own, and a signal to stop is not kept waiting by a replacement that is due later."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from ratewarden.server._workers import RESTART_GAP, RESTART_MAX, STABLE, Pace


def test_a_place_whose_workers_die_young_waits_twice_as_long_each_time() -> None:
    pace = Pace()
    now, starts = 100.0, []
    for _ in range(8):
        at = pace.due(now, lived=0.1)  # each dies a tenth of a second after its fork
        starts.append(at - 100.0)
        now = at + 0.1
    assert starts == [0.0, 1.0, 3.0, 7.0, 15.0, 31.0, 61.0, 91.0]
    assert (RESTART_GAP, RESTART_MAX) == (1.0, 30.0)  # what the figures above assume


def test_a_worker_that_lived_long_gives_its_place_the_short_wait_again() -> None:
    pace = Pace()
    for now in (0.0, 0.5, 1.5, 3.5):
        pace.due(now, lived=0.5)
    later = 1000.0
    assert pace.due(later, lived=STABLE) == later  # at once
    assert pace.due(later + 0.2, lived=0.2) == later + RESTART_GAP  # and then the short wait


def test_places_back_off_apart() -> None:
    """Workers that die together (all of them killed at once) are all replaced at once."""
    paces = [Pace() for _ in range(4)]
    assert [pace.due(50.0, lived=90.0) for pace in paces] == [50.0] * 4


@dataclass
class Stopped:
    said: str  # the supervisor's log, all of it
    out: str  # what it printed: its code
    took: float  # seconds from the SIGTERM to its end
    alive: bool  # it still ran when the log said what was waited for


def stop_once(script: str, args: list[str], said: str, times: int, pause: float = 0.0) -> Stopped:
    """Run a supervisor ``script``; once its log has said ``said`` ``times`` times
    (and ``pause`` seconds more), SIGTERM it and collect what it said."""
    # a session of its own: a worker the test leaves behind, hung, is killed with it
    process = subprocess.Popen([sys.executable, "-c", script, *args], text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True)  # fmt: skip
    assert process.stderr is not None
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 30
        while sum(said in line for line in lines) < times:
            assert time.monotonic() < deadline, "".join(lines)
            line = process.stderr.readline()
            assert line, "".join(lines)
            lines.append(line)
        time.sleep(pause)
        alive = process.poll() is None
        stopped = time.monotonic()
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=10)
        took = time.monotonic() - stopped
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return Stopped("".join(lines) + err, out.strip(), took, alive)


def supervisor(target: str) -> str:
    """A script that runs one worker of ``target`` (the source that defines it)
    under `supervise`, logs to stderr and prints ``code`` and its exit code."""
    head = """
        import logging, os, sys, time
        logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
        from ratewarden.server._workers import supervise
    """
    end = 'print("code", supervise(1, target), flush=True)'
    return textwrap.dedent(head) + textwrap.dedent(target) + end + "\n"


_DYING = supervisor("""

    def target(ready):
        ready()  # it served, then died: a crash, not a start that failed
        time.sleep(0.05)
        os._exit(9)
""")


@pytest.mark.slow
def test_a_worker_that_dies_on_every_start_is_replaced_ever_more_slowly() -> None:
    # stopped while the fourth replacement is a few seconds away: no wait for it
    run = stop_once(_DYING, [], "starting another", 4)
    said = run.said
    waits = [float(w or 0) for w in re.findall(r"starting another(?: in ([\d.]+) s)?\n", said)]
    assert len(waits) == 4, said
    assert waits[0] == 0, said
    assert 0 < waits[1] < waits[2] < waits[3], said
    assert waits[3] >= 3, said  # once a second would be 1
    assert run.took < 1.5, f"the stop waited {run.took:.1f} s for a replacement"
    assert run.out == "code 0", (run.out, said)
    assert "Traceback" not in said


_SLOW_REPLACEMENT = supervisor("""

    MARK = sys.argv[1]

    def target(ready):
        if not os.path.exists(MARK):  # the first worker serves, then dies
            open(MARK, "w").close()
            ready()
            time.sleep(0.05)
            os._exit(9)
        time.sleep(5)  # its replacement is slow to start: a stop comes meanwhile
        ready()
        time.sleep(60)
""")


@pytest.mark.slow
def test_a_stop_while_a_replacement_starts_ends_it_cleanly(tmp_path: Path) -> None:
    """The replacement is forked after the parent set its handlers: they must not
    run in it (they signal the parent's workers, which a child cannot look at)."""
    # half a second after it was forked, the replacement is starting
    run = stop_once(_SLOW_REPLACEMENT, [str(tmp_path / "mark")], "starting another", 1, 0.5)
    assert "Traceback" not in run.said, run.said
    assert run.out == "code 0", (run.out, run.said)
    assert run.took < 2, f"the stop took {run.took:.1f} s"


_BROKEN_REPLACEMENTS = supervisor("""

    MARK = sys.argv[1]

    def target(ready):
        if os.path.exists(MARK):  # the rule file is broken since the first started
            os._exit(2)
        open(MARK, "w").close()
        ready()
        time.sleep(0.05)
        os._exit(9)
""")


@pytest.mark.slow
def test_a_replacement_that_cannot_start_is_tried_again_and_serve_goes_on(
    tmp_path: Path,
) -> None:
    """Only the first workers' failure to start stops serve: a replacement's is
    a crash, tried again later, while the other workers serve on."""
    run = stop_once(_BROKEN_REPLACEMENTS, [str(tmp_path / "mark")],
                    "before it served: starting another", 2)  # fmt: skip
    said = run.said
    assert run.alive, said  # serve went on
    assert "a replacement worker (pid" in said, said
    assert "ended (exit code 2) before it served: starting another in" in said, said
    assert "stopping the others" not in said, said
    assert run.out == "code 0", (run.out, said)


_STUBBORN_START = supervisor("""

    import asyncio

    async def stubborn():  # a task of the start that a cancel does not end
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass

    def target(ready):
        async def start():
            asyncio.get_running_loop().create_task(stubborn())
            print("starting", file=sys.stderr, flush=True)
            await asyncio.sleep(3600)  # its listeners never open: no ready()

        asyncio.run(start())
""")


@pytest.mark.slow
def test_a_stop_while_a_worker_starts_its_event_loop_ends_it_at_once() -> None:
    """A stop that comes while a worker's event loop starts (before the loop
    takes the signals over) must end the worker, not unwind into the loop's
    shutdown, which waits for every task: one a cancel does not end hung serve."""
    run = stop_once(_STUBBORN_START, [], "starting", 1)
    assert run.out == "code 0", (run.out, run.said)
    assert run.took < 2, f"the stop took {run.took:.1f} s"
    assert "Traceback" not in run.said, run.said
