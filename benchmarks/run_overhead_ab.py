"""A/B of ``Session.run``'s fixed cost on tiny models: two checkouts of hetero in paired, alternating rounds, each
next to onnxruntime (per-call thread CPU time; run_overhead.py times one checkout's fast and checked paths).

    python benchmarks/run_overhead_ab.py [--models identity,add,atspm_function_1row] [--calls 2000] [--rounds 8]
        [--base /work/base33]

``identity`` and ``add`` are one-node models on a [1, 16] float input (a run that is nothing but the fixed cost);
other names come from tests/real_models/models.py. Each round runs one subprocess per checkout (``--base``: its
``core`` and ``plugins/cpu`` first on PYTHONPATH; this checkout's otherwise), the order alternating (base, new, new,
base, ...) so that the machine's phase hits both alike; a subprocess times ``--calls`` calls of hetero and of
onnxruntime (1 thread, sequential), alternating in blocks, each call by ``time.thread_time_ns`` (the median call).
Printed: per model the medians over rounds of each runtime's median call, and the median over rounds of the paired
ratios new / base and hetero / onnxruntime. On a shared machine, quote the ratios, not the microseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _tiny(op: str) -> tuple[bytes, dict[str, Any]]:
    import numpy as np
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])
    node = helper.make_node(op, ["x"] if op == "Identity" else ["x", "x"], ["y"])
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString(), {"x": np.ones((1, 16), np.float32)}


def _model(name: str) -> tuple[Any, dict[str, Any]]:
    if name in ("identity", "add"):
        return _tiny(name.capitalize())
    sys.path.insert(0, str(ROOT / "tests"))
    from real_models.models import MODELS

    model = MODELS[name]
    return str(model.file()), model.feeds(model)


def _median_call_us(fn: Any, calls: int) -> float:
    times = []
    clock = time.thread_time_ns
    for _ in range(calls):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times) / 1e3


def worker(models: list[str], calls: int) -> dict[str, dict[str, float]]:
    """One process: per model, the median call of hetero and of onnxruntime (4 alternating blocks of calls each)."""
    import onnxruntime as ort

    import hetero

    found = {}
    for name in models:
        source, feeds = _model(name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            session = hetero.Session(source, backends=["cpu"], on_fallback="silent", threads=1)
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 3
        theirs = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
        runners = {"hetero": lambda s=session, f=feeds: s.run(f),
                   "onnxruntime": lambda s=theirs, f=feeds: s.run(None, f)}
        samples: dict[str, list[float]] = {key: [] for key in runners}
        for fn in runners.values():  # warm: planned, recorded, the fast path set
            for _ in range(20):
                fn()
        for _ in range(4):
            for key, fn in runners.items():
                samples[key].append(_median_call_us(fn, max(1, calls // 4)))
        found[name] = {key: statistics.median(v) for key, v in samples.items()}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="identity,add,atspm_function_1row")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--base", default="", help="another checkout to compare with (its core and plugins/cpu)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    models = args.models.split(",")
    if args.worker:
        print(json.dumps(worker(models, args.calls)))
        return
    checkouts = {"new": ROOT} | ({"base": Path(args.base).resolve()} if args.base else {})
    results: dict[str, list[dict[str, dict[str, float]]]] = {key: [] for key in checkouts}
    order = list(checkouts)
    for round_ in range(args.rounds):
        for key in (order if round_ % 2 == 0 else order[::-1]):
            root = checkouts[key]
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                [str(root / "core"), str(root / "plugins" / "cpu"), os.environ.get("PYTHONPATH", "")]))
            out = subprocess.run([sys.executable, __file__, "--worker", "--models", args.models,
                                  "--calls", str(args.calls)], env=env, check=True, capture_output=True, text=True)
            results[key].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"load average {os.getloadavg()[0]:.2f}; {args.rounds} rounds, {args.calls} calls per process; "
          "us per call (thread CPU), medians over rounds")
    head = "| model | " + " | ".join(f"{k} hetero us | {k} ort us | {k} hetero/ort" for k in checkouts)
    head += " | new/base hetero |" if "base" in checkouts else " |"
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    for name in models:
        cells = []
        for key in checkouts:
            rounds = results[key]
            cells += [f"{statistics.median(r[name]['hetero'] for r in rounds):.2f}",
                      f"{statistics.median(r[name]['onnxruntime'] for r in rounds):.2f}",
                      f"{statistics.median(r[name]['hetero'] / r[name]['onnxruntime'] for r in rounds):.3f}"]
        if "base" in checkouts:
            pairs = zip(results["new"], results["base"], strict=True)
            cells.append(f"{statistics.median(n[name]['hetero'] / b[name]['hetero'] for n, b in pairs):.3f}")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
