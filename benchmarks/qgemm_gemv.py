"""The int8 GEMM of the quantized ops (``_native.qgemm_f32``, qlinear.cpp) at a few activation rows, as an int8 LSTM's
input projection or a streaming model's MatMulInteger runs it: thread CPU time per call, the K x N weights cycling
through ``--sets`` packed copies so that they come from L3 (as in a model, where the other layers' weights evict
them from L2) or, with ``--sets 1`` and a small K x N, from L2 (the compute alone). The load average is printed.

    HETERO_NUM_THREADS=1 python benchmarks/qgemm_gemv.py [--k 512] [--n 2048] [--sets 4] [--rows 1,2,4,8]

For a before / after, run it alternately with each build's plugin first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from hetero_cpu import _native


def time_rows(packs: list, k: int, n: int, m: int, reps: int, loops: int) -> float:
    """Median microseconds a call over ``reps`` samples of ``loops`` passes over every packed copy."""
    rng = np.random.default_rng(m)
    a = rng.integers(0, 256, (m, k), dtype=np.uint8)
    out = np.zeros((m, n), np.float32)
    scale = np.full(n, 0.01, np.float32)
    zero_point = np.array(3, np.uint8)
    for _ in range(20):
        for p in packs:
            _native.qgemm_f32(a, p, zero_point, scale, None, out)
    samples = []
    for _ in range(reps):
        start = time.thread_time()
        for _ in range(loops):
            for p in packs:
                _native.qgemm_f32(a, p, zero_point, scale, None, out)
        samples.append((time.thread_time() - start) / (loops * len(packs)) * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, default=512)
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--sets", type=int, default=4, help="packed copies of the weights cycled through")
    parser.add_argument("--rows", default="1,2,4,8", help="comma-separated activation row counts")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--loops", type=int, default=40)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    packs = [_native.qpack_b(rng.integers(-127, 128, (args.k, args.n), dtype=np.int8), None)
             for _ in range(args.sets)]
    print(f"load average {os.getloadavg()[0]:.2f}; {_native.qlinear_isa()}, {_native.num_threads()} thread(s); "
          f"K {args.k} x N {args.n} int8 ({args.k * args.n / 1024:.0f} KiB) x {args.sets} copies")
    for m in (int(r) for r in args.rows.split(",")):
        print(f"  M = {m}: {time_rows(packs, args.k, args.n, m, args.reps, args.loops):8.2f} us")


if __name__ == "__main__":
    main()
