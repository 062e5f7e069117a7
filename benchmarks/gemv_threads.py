"""One quantized GEMV (``llm_matmul``: a decode step's LM head, a projection) alone in a loop at 1 and 2 threads, the
thread counts alternated round by round, over copies of one random matrix (so that it streams from memory).

On a shared machine a 2-thread call is often slower than a 1-thread one only because a neighbour holds a core; so each
call is also checked for being *clean* (every pool thread's CPU clock advanced by the call's wall time: none of them
was descheduled) and the clean calls' wall time is printed beside the plain median, with the process CPU time. Also
checks that the outputs at 1 and 2 threads are the same bits.

    python benchmarks/gemv_threads.py --format q6_k --n 32768 --k 1536 --copies 3 --rounds 15

``--format q8`` / ``q4``: hetero's symmetric 32-blocks, the layouts of a GGUF file's Q8_0 / Q4_0 (the 0.5B's q8_0 LM
head: ``--format q8 --n 151936 --k 896``).

``--splits A,B``: instead, the 2-thread call under two decode splits (``_native.llm_decode_split``, the modes of
``HETERO_LLM_BLOCKS``: 0 equal tasks, 1 all by bytes, 2 q/k/v by bytes, 3 q/k/v and the big one-matrix GEMVs by
bytes), A and B alternated call by call (ABBA) on the same copy: the median of the pairs' B / A wall ratios (all
pairs, and the pairs of two clean calls), and per split the end spread (``pool_stats``' idle: how long the first
thread to run out of tasks waited on the last) of its clean calls. Outputs checked bitwise across the splits.

    python benchmarks/gemv_threads.py --format q8 --n 151936 --k 896 --copies 2 --rounds 10 --splits 2,3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from llm_kernels import weight
from pool_clock import ran_throughout

from hetero.contract import quant
from hetero_cpu import _native

CALLS = 6  # timed calls a thread count and round, after one untimed


def timed_call(w, x: np.ndarray, out: np.ndarray, threads: int) -> tuple[float, float, bool]:
    """(wall s, process CPU s, clean) of one call."""
    c0, p0, t0 = _native.pool_cpu_ns(), time.process_time(), time.perf_counter()
    _native.llm_matmul(w, x, out)
    t1, p1, c1 = time.perf_counter(), time.process_time(), _native.pool_cpu_ns()
    wall = t1 - t0
    clean = p1 - p0 >= wall - 2e-6 if threads == 1 else ran_throughout(c0, c1, wall, threads)
    return wall, p1 - p0, clean


def compare_splits(ws: list, x: np.ndarray, out: np.ndarray, nbytes: float, a: int, b: int, rounds: int) -> None:
    """2-thread calls under splits a and b alternated (ABBA), paired call by call (see the module's doc)."""
    _native.set_num_threads(2)
    _native.llm_matmul(ws[0], x, out)  # the pool's workers started
    _native.pool_stats_enable(True)
    before = _native.llm_decode_split(-1)
    calls: dict[int, list[tuple[float, bool, float, float]]] = {a: [], b: []}  # wall s, clean, end spread s, CPU s
    outs: dict[tuple[int, int], np.ndarray] = {}
    try:
        for r in range(rounds):
            for i in range(CALLS):
                c = (r * CALLS + i) % len(ws)
                for mode in (a, b) if (r * CALLS + i) % 2 == 0 else (b, a):
                    _native.llm_decode_split(mode)
                    _native.pool_stats(True)
                    wall, cpu, clean = timed_call(ws[c], x, out, 2)
                    calls[mode].append((wall, clean, _native.pool_stats(True)["idle_s"], cpu))
                    outs.setdefault((mode, c), out.copy())
    finally:
        _native.llm_decode_split(before)
        _native.pool_stats_enable(False)
    for mode, runs in calls.items():
        clean = [(w, idle) for w, ok, idle, _ in runs if ok]
        line = (f"split {mode}: wall median {statistics.median(r[0] for r in runs) * 1e3:.3f} ms, process CPU median "
                f"{statistics.median(r[3] for r in runs) * 1e3:.3f} ms; clean {len(clean)}")
        if clean:
            med = statistics.median(w for w, _ in clean)
            line += (f": median {med * 1e3:.3f} ms ({nbytes / med / 1e9:.1f} GB/s), end spread median "
                     f"{statistics.median(i for _, i in clean) * 1e6:.1f} us")
        print(line)
    pairs = list(zip(calls[a], calls[b], strict=True))
    ratios = sorted(rb[0] / ra[0] for ra, rb in pairs)
    both = sorted(rb[0] / ra[0] for ra, rb in pairs if ra[1] and rb[1])
    line = f"B / A wall ({b} / {a}, < 1: {b} faster): median of {len(ratios)} pairs {statistics.median(ratios):.3f}"
    if both:
        line += f"; of {len(both)} clean pairs {statistics.median(both):.3f}"
    # the process's CPU time (both threads, their spins included; a descheduled thread's time not): on a busy
    # machine the wall clock measures the neighbours, this one the call's work and its waits
    cpu = sorted(rb[3] / ra[3] for ra, rb in pairs)
    print(line + f"; B / A process CPU: median {statistics.median(cpu):.3f}")
    same = all(np.array_equal(outs[(a, c)], outs[(b, c)]) for c in range(len(ws)) if (a, c) in outs)
    print(f"outputs of the two splits bit-identical: {same}; load average {os.getloadavg()[0]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--format", default="q6_k", choices=sorted(quant.GGML_FORMATS) + list(quant.QUANT_WTYPES))
    ap.add_argument("--n", type=int, default=32768)
    ap.add_argument("--k", type=int, default=1536)
    ap.add_argument("--copies", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--splits", default="", help="A,B: compare two decode splits at 2 threads (see above)")
    args = ap.parse_args()
    fmt = quant.GGML_FORMATS.get(args.format) or quant.parse_quant(args.format)
    assert fmt is not None  # every --format choice names a format
    rng = np.random.default_rng(0)
    ws = [weight(fmt, args.n, args.k, rng)[0] for _ in range(args.copies)]
    nbytes = args.n * args.k * fmt.block_bytes / fmt.block_size
    x = rng.standard_normal(args.k).astype(np.float32)
    out = np.empty(args.n, np.float32)
    print(f"load average {os.getloadavg()[0]:.2f}; {args.format} {args.n} x {args.k}, {nbytes / 2**20:.1f} MiB a copy")
    if args.splits:
        a, b = (int(m) for m in args.splits.split(","))
        compare_splits(ws, x, out, nbytes, a, b, args.rounds)
        return
    runs: dict[int, list[tuple[float, float, bool]]] = {1: [], 2: []}
    outs: dict[tuple[int, int], np.ndarray] = {}
    for r in range(args.rounds):
        for threads in (1, 2):
            _native.set_num_threads(threads)
            _native.llm_matmul(ws[0], x, out)  # the new pool's workers started
            for i in range(CALLS):
                c = (r * CALLS + i) % args.copies
                runs[threads].append(timed_call(ws[c], x, out, threads))
                outs.setdefault((threads, c), out.copy())
    for threads, calls in runs.items():
        clean = [w for w, _, ok in calls if ok]
        line = (f"{threads} thread(s): wall median {statistics.median(w for w, _, _ in calls) * 1e3:.3f} ms, "
                f"process CPU median {statistics.median(p for _, p, _ in calls) * 1e3:.3f} ms; clean {len(clean)} of "
                f"{len(calls)}")
        if clean:
            med = statistics.median(clean)
            line += f": median {med * 1e3:.3f} ms ({nbytes / med / 1e9:.1f} GB/s), min {min(clean) * 1e3:.3f} ms"
        print(line)
    same = all(np.array_equal(outs[(1, c)], outs[(2, c)]) for c in range(args.copies) if (2, c) in outs)
    print(f"outputs at 1 and 2 threads bit-identical: {same}; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
