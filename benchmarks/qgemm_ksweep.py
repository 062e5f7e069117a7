"""A quantized GEMM's M-row cost against K at a fixed weight size: for each K, ``--copies`` random GGUF matrices of
N x K (N ~ ``--nk`` / K, a multiple of 16; by default ~7.7 MB each, the 1.5B's down_proj, so 8 copies stream from
memory), M = 1-4 activation rows alternated pass by pass, every call through the plugin (``llm_matmul``, one thread)
timed in thread CPU time. Prints per K the weights' GB/s at M = 1 and M = 2, the median of the passes' paired
M = 2 / M = 1 ratios and M = 3 / 4's medians relative to M = 1. The weight stream is the same bytes in the same
order at every K; what changes is how many weight bytes pass between two reads of an x line (a 16-row group:
K / 256 * 144 * 16 for q4_k).

    PYTHONPATH=core:plugins/cpu python benchmarks/qgemm_ksweep.py --format q4_k --k 1536,2048,2560,3072,4608,8960
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--format", default="q4_k")
    ap.add_argument("--k", default="1536,3072,4608,6144,8960", help="comma-separated K (multiples of 256)")
    ap.add_argument("--nk", type=int, default=8960 * 1536, help="N * K of one matrix")
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--passes", type=int, default=41)
    args = ap.parse_args()
    from hetero.contract import quant
    from hetero_cpu import _native

    fmt = quant.GGML_FORMATS[args.format]
    rng = np.random.default_rng(0)

    def weight(n: int, k: int) -> Any:
        raw = rng.integers(0, 256, (n, fmt.blocks(k), fmt.block_bytes), dtype=np.uint8)
        for at in fmt.f16_fields:  # small finite scales
            scales = (rng.standard_normal((n, fmt.blocks(k))) * 0.02).astype(np.float16)
            raw[..., at:at + 2] = scales[..., None].view(np.uint8)
        return _native.llm_weights(raw.reshape(n, fmt.row_bytes(k)), args.format, k=k)

    ks = [int(k) for k in args.k.split(",")]
    sets = {k: [weight((args.nk // k + 15) // 16 * 16, k) for _ in range(args.copies)] for k in ks}
    rows = (1, 2, 3, 4)
    xs = {(m, k): rng.standard_normal((m, k)).astype(np.float32) for m in rows for k in ks}
    ys = {(m, k): np.empty((m, sets[k][0].n), np.float32) for m in rows for k in ks}
    times: dict[tuple[int, int], list[float]] = {(m, k): [] for m in rows for k in ks}
    for p in range(args.passes + 1):
        for k in ks[p % len(ks):] + ks[:p % len(ks)]:
            for m in rows[p % 4:] + rows[:p % 4]:
                x, y, spent = xs[m, k], ys[m, k], 0.0
                for w in sets[k]:
                    t0 = time.thread_time()
                    _native.llm_matmul(w, x, y, None)
                    spent += time.thread_time() - t0
                if p:  # the first pass warms up
                    times[m, k].append(spent)
    for k in ks:
        first = sets[k][0]
        nbytes = args.copies * first.nbytes
        med = {m: statistics.median(times[m, k]) for m in rows}
        paired = statistics.median(a / b for a, b in zip(times[2, k], times[1, k], strict=True))
        print(f"{args.format} K={k} N={first.n}: M=1 {nbytes / med[1] / 1e9:.1f} GB/s | "
              f"M=2 {nbytes / med[2] / 1e9:.1f} GB/s (paired {paired:.2f}x) | M=3 {med[3] / med[1]:.2f}x | "
              f"M=4 {med[4] / med[1]:.2f}x")


if __name__ == "__main__":
    main()
