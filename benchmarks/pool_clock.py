"""Whether every thread of the cpu plugin's pool ran throughout a timed interval (a *clean* run).

``_native.pool_cpu_ns()`` gives each pool thread's own CPU clock (-1 for a thread it cannot read). A run is clean
when every thread's clock advanced by at least the run's wall time: no thread was preempted, descheduled or asleep,
which is what a quiet machine runs. ``decode_threads.py`` and ``gemv_threads.py`` keep their clean runs apart by it.
"""

from __future__ import annotations

from collections.abc import Sequence

SLACK_NS = 2000  # the two clock reads around the run


def ran_throughout(before: Sequence[int], after: Sequence[int], wall_s: float, threads: int | None = None) -> bool:
    """True when each thread's CPU clock (``before`` -> ``after``, ns) advanced by ``wall_s`` (less the slack);
    with ``threads``, also that both reads saw that many threads."""
    if len(before) != len(after) or (threads is not None and len(before) != threads):
        return False
    return all(a >= 0 and b - a >= wall_s * 1e9 - SLACK_NS for a, b in zip(before, after, strict=True))
