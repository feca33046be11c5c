"""Machine instructions per hit, counted by callgrind: ours, `limits` and the floor.

Timings on shared virtual machines swing by 2x between runs; instruction
counts do not (the same binary, input and environment give the same count). They are
not time (cache misses and atomic instructions cost more than they count), so this
complements bench_memory.py rather than replacing it.

    .venv/bin/python bench/bench_instructions.py [--passes N]

Each candidate runs twice under ``valgrind --tool=callgrind``: once with no passes and
once with N passes over 1,000 keys (all hits allowed: 10**9/hour, or 1000/hour for
the logs); the difference divided by the hits is the cost of one hit, with the loop
and call overhead in every figure, the floor's included. Real clocks throughout.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

TARGET = Path(__file__).with_name("_icount_target.py")
KEYS = 1000
OURS = [
    "fixed_window",
    "sliding_window_counter",
    "token_bucket",
    "token_bucket:interval",
    "leaky_bucket",
    "gcra",
    "sliding_window_log",
]
ANCHOR = {  # ours -> the limits strategy it is compared with
    "fixed_window": "limits:fixed_window",
    "sliding_window_counter": "limits:sliding_window_counter",
    "token_bucket": "limits:fixed_window",  # limits has no bucket
    "sliding_window_log": "limits:moving_window",
}


def count(candidate: str, passes: int) -> int:
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
         str(TARGET), candidate, str(passes)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    match = re.search(r"Collected : (\d+)", out.stderr)
    if match is None:
        raise SystemExit(f"callgrind printed no count for {candidate}:\n{out.stderr[-2000:]}")
    return int(match.group(1))


def per_hit(candidate: str, passes: int) -> float:
    return (count(candidate, passes) - count(candidate, 0)) / (passes * KEYS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=20)
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    names = ["floor", *OURS, *sorted(set(ANCHOR.values()))]
    figures = {}
    for name in names:
        figures[name] = per_hit(name, args.passes)
        print(f"  counted {name}", file=sys.stderr, flush=True)
    floor = figures["floor"]
    print(f"instructions per hit, {args.passes} passes over {KEYS} keys, all allowed")
    print(f"{'candidate':<32}{'instr/hit':>10}{'x floor':>9}   vs limits")
    for name in names:
        line = f"{name:<32}{figures[name]:>10.0f}{figures[name] / floor:>9.2f}"
        if name in ANCHOR:
            anchor = ANCHOR[name]
            line += f"   {figures[anchor] / figures[name]:.2f}x fewer than {anchor}"
        print(line)


if __name__ == "__main__":
    main()
