"""Loading an envoyproxy/ratelimit configuration of 10,000 descriptors.

Run from the project root:

    .venv/bin/python bench/bench_envoy_load.py           # full run, about half a minute
    .venv/bin/python bench/bench_envoy_load.py --quick   # smoke run, a few seconds

What it measures: ``EnvoyConfig.load(path)`` from the file on disk to a config
ready to answer (read, YAML parsed with libyaml, the peer's key checks, typed,
the trees built with every duplicate and share_threshold check), for configs of
1,000, 10,000 and 100,000 descriptors. The config mixes what users write: a
domain per 500 descriptors, top-level keys with exact values, a key with no
value, nested two-level descriptors, trailing and middle wildcards (a few with
share_threshold), detailed_metric, shadow_mode, names and replaces, metadata.
Half the wildcards sit under one key of one domain, the worst case for the
duplicate check.

The anchor is the floor: ``yaml.load`` of the same text with libyaml's
``CSafeLoader`` alone, the part no loader of this format can skip. The peer's
users report ~45 s loads for configs of this size (a Go service; not run here).
Each figure is the minimum and the median over rounds, in seconds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

import ratewarden
from ratewarden.rules import EnvoyConfig

SIZES = (1_000, 10_000, 100_000)
PER_DOMAIN = 500


def make_domains(n: int) -> list[str]:
    """``n`` descriptors (nested ones counted) as one file's text per domain."""
    files = []
    made = 0
    d = 0
    while made < n:
        lines = [f"domain: domain{d}", "descriptors:"]
        here = 0
        i = 0
        while here < PER_DOMAIN and made + here < n:
            kind = i % 10
            unit = ("second", "minute", "hour", "day")[i % 4]
            limit = f"rate_limit: {{unit: {unit}, requests_per_unit: {10 + i}}}"
            if kind in (0, 1, 2):
                lines += [f"  - key: k{i % 7}", f"    value: v{i}", f"    {limit}"]
                here += 1
            elif kind == 3:
                lines += [f"  - key: any{i}", f"    {limit}", "    detailed_metric: true"]
                here += 1
            elif kind == 4:
                lines += ["  - key: tenant", f"    value: t{i}", "    descriptors:",
                          "      - key: user", f"        {limit}",
                          "      - key: user", f"        value: admin{i}",
                          "        rate_limit: {unlimited: true}"]  # fmt: skip
                here += 3
            elif kind == 5:
                lines += ["  - key: path", f"    value: /api/v{i}/*", f"    {limit}"]
                here += 1
            elif kind == 6:
                lines += ["  - key: path", f"    value: /files{i}/*/x*",
                          "    share_threshold: true", f"    {limit}"]  # fmt: skip
                here += 1
            elif kind == 7:
                lines += ["  - key: route", f"    value: r{i}", "    shadow_mode: true",
                          f"    {limit}", "    metadata: {team: t, tier: 2}"]  # fmt: skip
                here += 1
            else:
                name = f"n{i}"
                lines += ["  - key: svc", f"    value: s{i}",
                          f"    rate_limit: {{unit: minute, requests_per_unit: 5, name: {name},"
                          f" replaces: [{{name: other{i}}}]}}"]  # fmt: skip
                here += 1
            i += 1
        files.append("\n".join(lines) + "\n")
        made += here
        d += 1
    return files


def write_files(n: int, directory: Path) -> list[Path]:
    paths = []
    for d, text in enumerate(make_domains(n)):
        path = directory / f"domain{d:04d}.yaml"
        path.write_text(text)
        paths.append(path)
    return paths


def timed(fn: object, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        gc.collect()
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - started)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sizes = SIZES[:2] if args.quick else SIZES
    rounds = 3 if args.quick else 7
    print(f"ratewarden {ratewarden.__version__}, Python {platform.python_version()}, "
          f"{platform.machine()}, {dt.date.today()}")  # fmt: skip
    print("| descriptors | files | EnvoyConfig.load min / median s | yaml CSafeLoader alone "
          "min / median s | load / floor |")  # fmt: skip
    print("|---|---|---|---|---|")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            paths = write_files(n, Path(tmp))
            config = EnvoyConfig.load(Path(tmp))
            nodes = sum(_count(level) for level in config.domains.values())
            assert nodes == n, (nodes, n)  # the config is the size it says
            ours = timed(lambda tmp=tmp: EnvoyConfig.load(Path(tmp)), rounds)
            texts = [p.read_text() for p in paths]
            floor = timed(lambda texts=texts: [yaml.load(t, Loader=loader) for t in texts], rounds)
        print(f"| {n:,} | {len(paths)} | {min(ours):.3f} / {statistics.median(ours):.3f} | "
              f"{min(floor):.3f} / {statistics.median(floor):.3f} | "
              f"{min(ours) / min(floor):.2f}x |")  # fmt: skip
    return 0


def _count(level: object) -> int:
    total = 0
    for table in (level.exact, level.any_value):  # type: ignore[attr-defined]
        for node in table.values():
            total += 1 + _count(node.children)
    for nodes in level.wildcards.values():  # type: ignore[attr-defined]
        for _, node in nodes:
            total += 1 + _count(node.children)
    return total


if __name__ == "__main__":
    sys.exit(main())
