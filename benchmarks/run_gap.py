"""Where a small model's ``Session.run`` time goes beyond the sum of its nodes, at 1 thread, by thread CPU time.

    python benchmarks/run_gap.py [--model minilm_l3] [--threads 1] [--rounds 15] [--runs 8]

One process, four schedules alternating round by round (each round: one sample of ``--runs`` calls per schedule,
each call timed on its own, ``time.thread_time``), the way ``onnx_models.time_interleaved`` samples and without it:

- ``alt``: a 50 ms sleep, hetero's sample, a 50 ms sleep, onnxruntime's sample (what onnx_models.py measures);
- ``sleep``: a 50 ms sleep before each runtime's sample, no other runtime between (the sleep's effect alone);
- ``solo``: the runtime's calls back to back, no sleep, nothing between samples;
- ``nodes``: a second hetero session whose node calls are timed one by one (onnx_node_profile's wrapping): its
  ``run`` total next to the sum of its nodes, back to back.

Per schedule: the median call, the median first call of a sample (the one after the sleep / the other runtime) and
the median of the other calls, and minor page faults per call (``getrusage(RUSAGE_THREAD)``). The load average is
printed: on a shared machine, the 50 ms sleeps let other processes run on the core and evict its caches.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from onnx_models import MODELS  # noqa: E402


def _minflt() -> int:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


class Timed:
    """Per-call thread-CPU times and minor faults of one runner, split into a sample's first call and the rest."""

    def __init__(self, fn: Callable[[], object]) -> None:
        self.fn = fn
        self.first: list[float] = []
        self.rest: list[float] = []
        self.faults: list[int] = []

    def sample(self, runs: int, sleep_s: float) -> None:
        if sleep_s:
            time.sleep(sleep_s)
        for i in range(runs):
            f0 = _minflt()
            t0 = time.thread_time()
            self.fn()
            dt = (time.thread_time() - t0) * 1e3
            self.faults.append(_minflt() - f0)
            (self.first if i == 0 else self.rest).append(dt)

    def row(self, name: str) -> str:
        med = statistics.median(self.first + self.rest)
        rest = f"{statistics.median(self.rest):.3f}" if self.rest else ""
        return (f"| {name} | {med:.3f} | {statistics.median(self.first):.3f} | {rest} | "
                f"{statistics.mean(self.faults):.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm_l3")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--sleep", type=float, default=0.05)
    args = parser.parse_args()

    import onnxruntime as ort

    import hetero

    model = MODELS[args.model]
    path = str(model.file())
    feeds = model.feeds(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    peer = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hetero.HeteroWarning)
        session = hetero.Session(path, backends=["cpu"], on_fallback="silent", threads=args.threads)
        probe = hetero.Session(path, backends=["cpu"], on_fallback="silent", threads=args.threads)

    # the node-timed session: each bound call adds its thread time to acc (as onnx_node_profile does)
    acc: dict[str, float] = defaultdict(float)
    per_node: dict[str, list[float]] = defaultdict(list)

    def timed(name: str, call: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            t0 = time.thread_time()
            call()
            acc[name] += time.thread_time() - t0
        return run

    for node, kernel in probe.kernels():
        bind = getattr(kernel, "bind", None)
        if bind is None:
            continue

        def wrapped(ins, outs, _bind=bind, _name=node.name):
            call = _bind(ins, outs)
            if call is None:
                return None
            return timed(_name, call) if callable(call) else [timed(_name, c) for c in call]
        kernel.bind = wrapped
    probe.invalidate_replay()

    het = {k: Timed(lambda: session.run(feeds)) for k in ("alt", "sleep", "solo")}
    onx = {k: Timed(lambda: peer.run(None, feeds)) for k in ("alt", "sleep", "solo")}
    node_total, node_sum = Timed(lambda: probe.run(feeds)), []
    for _ in range(10):
        session.run(feeds), peer.run(None, feeds), probe.run(feeds)
    for t in (*het.values(), *onx.values(), node_total):
        t.first.clear(), t.rest.clear(), t.faults.clear()

    print(f"{args.model}, {args.threads} thread(s), {args.rounds} rounds x {args.runs} calls; "
          f"load average before: {os.getloadavg()}")
    for _ in range(args.rounds):
        het["alt"].sample(args.runs, args.sleep)
        onx["alt"].sample(args.runs, args.sleep)
        het["sleep"].sample(args.runs, args.sleep)
        het["sleep"].sample(args.runs, args.sleep)
        onx["sleep"].sample(args.runs, args.sleep)
        onx["sleep"].sample(args.runs, args.sleep)
        het["solo"].sample(1, 0.0)  # warm the cache state of this schedule; not counted below
        het["solo"].first.pop(), het["solo"].faults.pop()
        het["solo"].sample(args.runs, 0.0)
        onx["solo"].sample(1, 0.0)
        onx["solo"].first.pop(), onx["solo"].faults.pop()
        onx["solo"].sample(args.runs, 0.0)
        for _ in range(args.runs):
            acc.clear()
            node_total.sample(1, 0.0)
            node_sum.append(sum(acc.values()) * 1e3)
            for name, t in acc.items():
                per_node[name].append(t * 1e3)
    print("\n| schedule | median ms | first call ms | other calls ms | minor faults / call |")
    print("|---|---:|---:|---:|---:|")
    for k, t in het.items():
        print(t.row(f"hetero {k}"))
    for k, t in onx.items():
        print(t.row(f"onnxruntime {k}"))
    print(node_total.row("hetero node-timed run"))
    print(f"| hetero node sum ({len(per_node)} nodes), median of the per-call sums | "
          f"{statistics.median(node_sum):.3f} | | | |")
    print(f"| hetero node sum, sum of the per-node medians (onnx_node_profile's figure) | "
          f"{sum(statistics.median(v) for v in per_node.values()):.3f} | | | |")
    gaps = [a - b for a, b in zip(node_total.first, node_sum, strict=True)]
    print(f"| node-timed run - its node sum (median per call) | {statistics.median(gaps):.3f} | | | |")
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
