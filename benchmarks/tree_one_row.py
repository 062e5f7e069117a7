"""One-row calls of a tree ensemble, hetero's bound kernel (``TreeForest.run``, no session) against onnxruntime's
``InferenceSession.run`` (its per-call cost included: ~5 us here, see run_overhead.py), on one row repeated (what
onnx_models.py times: a branchy walk's predictor learns it) and on a new row each call (one of 256), interleaved
in rounds, thread CPU time, 1 thread. Medians of the rounds' medians, in us.

    python benchmarks/tree_one_row.py --model atspm_phase_lgbm_1row
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the model catalogue is shared with the tests

from real_models.models import MODELS, tree_rows  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="atspm_phase_lgbm_1row")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()

    import onnxruntime as ort

    import hetero
    from hetero.contract import trees as ml
    from hetero_cpu import _native
    from hetero_cpu.kernels.trees import native_forest

    _native.set_num_threads(1)
    path = MODELS[args.model].file()
    assert path is not None, f"{args.model}: the model file is not installed"
    repeated = np.ascontiguousarray(next(iter(tree_rows(path, 1).values())), np.float64)
    many = next(iter(tree_rows(path, 256, seed=1).values()))
    new_rows = [np.ascontiguousarray(many[i:i + 1], np.float64) for i in range(len(many))]
    node = hetero.load(str(path)).nodes[0]
    forest = native_forest(ml.forest_for(node, np.dtype(np.float64)), with_base=True)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 1, 1
    peer = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    name = peer.get_inputs()[0].name
    out = np.empty((1, forest.n_targets))

    def timed(call: Callable[[np.ndarray], object], new: bool) -> float:
        taken = []
        for i in range(args.calls):
            x = new_rows[i % len(new_rows)] if new else repeated
            t0 = time.thread_time_ns()
            call(x)
            taken.append(time.thread_time_ns() - t0)
        return statistics.median(taken) / 1e3

    runners: dict[str, Callable[[np.ndarray], object]] = {
        "hetero kernel": lambda x: forest.run(x, out), "onnxruntime run": lambda x: peer.run(None, {name: x})}
    times: dict[tuple[str, bool], list[float]] = {(k, new): [] for k in runners for new in (False, True)}
    for _ in range(args.rounds):
        for new in (False, True):
            for k, call in runners.items():
                times[(k, new)].append(timed(call, new))
    print(f"{args.model}: chained walk {forest.one_row_chain if hasattr(forest, 'one_row_chain') else 'n/a'}")
    for (k, new), v in times.items():
        print(f"  {k:16s} {'new rows' if new else 'repeated row':12s} {statistics.median(v):7.2f} us")


if __name__ == "__main__":
    main()
