"""One-row tree-ensemble calls at 1 and 2 threads, alternated in one process: whether the cpu kernel's tree split
(src/trees.cpp, row_split: from kSplitTrees trees x rows, only while the pool's workers are awake) pays, on atspm's
LightGBM forests cut to their first N trees. The pool's workers spin between calls (set_pool_spin_us) so that the
split runs whenever a worker has a CPU; each round times ``--calls`` direct ``TreeForest.run`` calls at 1 thread,
then at 2, and the script prints each side's median and the median of the rounds' 2-thread / 1-thread ratios.
Below kSplitTrees trees both sides run the same serial walk (a ratio of ~1: the noise floor). Outputs are checked
bit for bit between the two sides.

    python benchmarks/tree_row_threads.py --models atspm_phase_lgbm_1row,atspm_function_1row --trees 128,384,0
    python benchmarks/tree_row_threads.py --new-rows     # a different row each call (one of 256), not one repeated

--trees 0: the whole forest. Measure on a quiet machine: on a busy one the second thread rarely gets a CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the model catalogue is shared with the tests

from real_models.models import MODELS, tree_rows  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="atspm_phase_lgbm_1row,atspm_function_1row")
    parser.add_argument("--trees", default="128,384,0", help="first N trees of each forest (0: all)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--new-rows", action="store_true", help="a different row each call")
    args = parser.parse_args()

    import hetero
    from hetero.contract import trees as ml
    from hetero_cpu import _native
    from hetero_cpu.kernels.trees import native_forest

    spin = _native.pool_spin_us()
    _native.set_pool_spin_us(1_000_000)
    try:
        for name in args.models.split(","):
            model = MODELS[name]
            path = model.file()
            assert path is not None, f"{name}: the model file is not installed"
            feed = next(iter(tree_rows(path, 1).values()))
            many = next(iter(tree_rows(path, 256).values()))
            node = hetero.load(str(path)).nodes[0]
            full = ml.forest_for(node, np.dtype(np.float64))
            for n in (int(v) for v in args.trees.split(",")):
                cut = full if n <= 0 else dataclasses.replace(full, roots=full.roots[:n])
                forest = native_forest(cut, with_base=True)
                x = np.ascontiguousarray(feed, np.float64).copy()
                out = {t: np.empty((1, forest.n_targets)) for t in (1, 2)}
                times: dict[int, list[float]] = {1: [], 2: []}
                for _ in range(args.rounds):
                    for threads in (1, 2):
                        _native.set_num_threads(threads)
                        x[:] = feed
                        for _ in range(20):  # warm: the forest's paths, the new pool's worker
                            forest.run(x, out[threads])
                        taken = []
                        for i in range(args.calls):
                            if args.new_rows:
                                x[0] = many[i % len(many)]
                            t0 = time.perf_counter()
                            forest.run(x, out[threads])
                            taken.append(time.perf_counter() - t0)
                        times[threads].append(statistics.median(taken) * 1e6)
                    assert np.array_equal(out[1], out[2]), f"{name}: 2 threads differ from 1"
                ratios = [b / a for a, b in zip(times[1], times[2], strict=True)]
                print(f"{name} trees={forest.n_trees} {'new rows' if args.new_rows else 'repeated row'}: "
                      f"1 thread {statistics.median(times[1]):.2f} us, 2 threads {statistics.median(times[2]):.2f} us, "
                      f"2/1 {statistics.median(ratios):.3f} [{min(ratios):.2f}-{max(ratios):.2f}]", flush=True)
    finally:
        _native.set_pool_spin_us(spin)


if __name__ == "__main__":
    main()
