"""Time to a model's first result: hetero's ``Session(path)`` and first run against onnxruntime's, per real model.

    PYTHONPATH=core:plugins/cpu python benchmarks/session_load.py [--models terrain_unet,magika] [--repeat 3]

A user who swaps onnxruntime for hetero feels the load (parse, graph passes, weight packing) and the first run
(hetero records its replay program and plans its arena there) before any steady-state latency. For each model of
tests/real_models/models.py that is installed: the median of ``--repeat`` loads and first runs per runtime, the two
runtimes alternating, at 1 thread, in one process (plugin discovery and imports happen once, before the timing, as in
an application that loads several models).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the model catalogue is shared with the tests

from real_models.models import MODELS, Feeds  # noqa: E402


def hetero_times(path: Path, feeds: Feeds) -> tuple[float, float, int]:
    import hetero

    start = time.perf_counter()
    session = hetero.Session(str(path), backends=["cpu"], on_fallback="silent", threads=1)
    loaded = time.perf_counter()
    session.run(feeds)
    return loaded - start, time.perf_counter() - loaded, len(session.graph.nodes)


def ort_times(path: Path, feeds: Feeds) -> tuple[float, float]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    start = time.perf_counter()
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    loaded = time.perf_counter()
    session.run(None, feeds)
    return loaded - start, time.perf_counter() - loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated names from the catalogue")
    parser.add_argument("--repeat", type=int, default=3, help="loads per runtime (median reported)")
    args = parser.parse_args()
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
    import hetero

    warnings.simplefilter("ignore", hetero.HeteroWarning)
    hetero.backends()  # plugin discovery and probing, once: not part of any model's load
    print(f"load average before: {', '.join(f'{v:.2f}' for v in os.getloadavg())}\n")
    print("| model | nodes after passes | hetero load ms | hetero first run ms | onnxruntime load ms | "
          "onnxruntime first run ms | load ratio | load + first run ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in names:
        model = MODELS[name]
        path = model.file()
        if path is None:
            print(f"skipped {model.install_hint}", file=sys.stderr)
            continue
        feeds = model.feeds(model)
        hetero_runs, ort_runs, nodes = [], [], 0
        for _ in range(args.repeat):
            load, first, nodes = hetero_times(path, feeds)
            hetero_runs.append((load, first))
            ort_runs.append(ort_times(path, feeds))
        h_load, h_first = (statistics.median(r[i] for r in hetero_runs) * 1e3 for i in (0, 1))
        o_load, o_first = (statistics.median(r[i] for r in ort_runs) * 1e3 for i in (0, 1))
        print(f"| {name} | {nodes} | {h_load:.0f} | {h_first:.0f} | {o_load:.0f} | {o_first:.0f} | "
              f"{h_load / o_load:.2f} | {(h_load + h_first) / (o_load + o_first):.2f} |", flush=True)
    print(f"\nload average after: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
