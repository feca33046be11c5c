"""The rule file the front ends' shaping tests share: a degrade rule whose level
grows 0.25 a request past its limit, and a short paced queue."""

from __future__ import annotations

import textwrap

SHAPING = textwrap.dedent("""
    rules:
      - name: video
        rate: 2/minute
        algorithm: fixed_window
        by: ip
        action: degrade
        degrade: {header: true, full_at: 3}
        match: {paths: /video}
      - name: line
        rate: 2/second
        action: queue
        queue: 2
        match: {paths: /line}
""")
START = 1_700_000_040.0  # 40 s into a minute: the fixed windows do not roll in a test
LEVELS = [0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.0]  # video's level, request by request
