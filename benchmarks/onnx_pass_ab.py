"""A/B of graph passes on one real ONNX model, in one process: a hetero session with the default passes, one without
the passes named, and onnxruntime, called in turn round by round (a busy machine loads all three alike); medians of
wall time and of the calling thread's CPU time (at 1 thread the comparable clock on a busy machine; at 2+ it leaves
out the pool's threads). Checks first that both sessions give the same outputs (max |difference| printed).

    python benchmarks/onnx_pass_ab.py --model tashkeel_bilstm --without fuse_broadcast_unary_matmul --threads 1,2
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from real_models.models import MODELS  # noqa: E402

import hetero  # noqa: E402
from hetero.ir import passes  # noqa: E402


def _session(path: str, threads: int, without: set[str]) -> hetero.Session:
    """A cpu session whose graph passes leave out ``without`` (the session takes ``for_backend``'s default list)."""
    with passes.leaving_out(*without):
        return hetero.Session(path, backends=["cpu"], threads=threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, choices=sorted(MODELS))
    parser.add_argument("--without", required=True, help="comma-separated pass names (hetero.ir.passes)")
    parser.add_argument("--threads", default="1")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    without = set(args.without.split(","))
    unknown = without - {p.__name__ for p in passes.DEFAULT_PASSES}
    if unknown:
        parser.error(f"not a default pass: {', '.join(sorted(unknown))}")
    import onnxruntime as ort

    model = MODELS[args.model]
    path = model.file()
    if path is None:
        sys.exit(f"{args.model}: not installed ({model.package})")
    feeds = model.feeds(model)
    for threads in (int(t) for t in args.threads.split(",")):
        with_pass, without_pass = _session(str(path), threads, set()), _session(str(path), threads, without)
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        ort_session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        runs: dict[str, Callable[[], object]] = {
            "hetero": functools.partial(with_pass.run, feeds),
            f"hetero without {args.without}": functools.partial(without_pass.run, feeds),
            "onnxruntime": functools.partial(ort_session.run, None, feeds)}
        a, b = with_pass.run(feeds), without_pass.run(feeds)
        # as float64: a model may also return bool / integer outputs (the romanizer's mask)
        diff = max(float(np.abs(np.asarray(a[k], np.float64) - np.asarray(b[k], np.float64)).max()) for k in a)
        for run in runs.values():
            for _ in range(3):
                run()
        wall: dict[str, list[float]] = {k: [] for k in runs}
        cpu: dict[str, list[float]] = {k: [] for k in runs}
        before = os.getloadavg()
        for _ in range(args.rounds):
            for name, run in runs.items():
                t0, c0 = time.perf_counter(), time.thread_time()
                run()
                cpu[name].append(time.thread_time() - c0)
                wall[name].append(time.perf_counter() - t0)
        print(f"\n{args.model}, {threads} thread(s), {args.rounds} rounds; load {before[0]:.2f} before, "
              f"{os.getloadavg()[0]:.2f} after; max |with - without| = {diff:.3g}")
        ort_wall, ort_cpu = statistics.median(wall["onnxruntime"]), statistics.median(cpu["onnxruntime"])
        for name in runs:
            w, c = statistics.median(wall[name]), statistics.median(cpu[name])
            print(f"  {name:50s} wall {w * 1e3:8.2f} ms ({w / ort_wall:.2f} x ort)   thread CPU {c * 1e3:8.2f} ms "
                  f"({c / ort_cpu:.2f} x ort)")


if __name__ == "__main__":
    main()
