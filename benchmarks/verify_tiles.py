"""Where a speculative verify step's QMatMul time goes, per weight tensor kind: every QMatMul weight of a real model
is multiplied by M activation rows in the model's own order (so the ~1 GiB of weights streams from memory as in a
step), each call timed in thread CPU time, M = 1 and each ``--rows`` value alternated pass by pass; prints per kind
(the node's name without its layer number, with its shape and bits per weight) the median milliseconds of a pass at
M = 1 and each M's cost relative to M = 1, and the total.

    PYTHONPATH=core:plugins/cpu python benchmarks/verify_tiles.py /work/models/qwen2.5-coder-1.5b.gguf \
        --rows 2,4,8,12 --passes 7

One thread (the plugin's pool at 1 thread: the calls run on this thread).
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
import warnings
from collections import defaultdict
from typing import Any


def weights(llm: Any) -> list[tuple[str, Any]]:
    """(kind, native weight) of every QMatMul of the session, in run order."""
    out = []
    for node, kernel in llm.session.kernels():
        if type(kernel).__name__ == "CpuQMatMul" and kernel.w is not None:
            kind = re.sub(r"\d+", "#", node.name)
            w = kernel.w
            out.append((f"{kind} {w.n}x{w.k} {8 * w.nbytes / (w.n * w.k):.2f}b", w))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--rows", default="2,4,8,12")
    ap.add_argument("--passes", type=int, default=7)
    args = ap.parse_args()
    import numpy as np

    import hetero.llm
    from hetero_cpu import _native

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        llm = hetero.llm.load(args.model, backends=["cpu"], on_fallback="silent", threads=1, context=256)
    ws = weights(llm)
    rows = [1, *(int(r) for r in args.rows.split(","))]
    rng = np.random.default_rng(0)
    xs = {(m, w.k): rng.standard_normal((m, w.k)).astype(np.float32) for m in rows for _, w in ws}
    outs = {(m, w.n): np.empty((m, w.n), np.float32) for m in rows for _, w in ws}
    times: dict[int, dict[str, list[float]]] = {m: defaultdict(list) for m in rows}
    for p in range(args.passes + 1):
        for m in rows[p % len(rows):] + rows[:p % len(rows)]:
            per: dict[str, float] = defaultdict(float)
            for kind, w in ws:
                x, y = xs[m, w.k], outs[m, w.n]
                t0 = time.thread_time()
                _native.llm_matmul(w, x, y, None)
                per[kind] += time.thread_time() - t0
            if p:  # the first pass warms up
                for kind, s in per.items():
                    times[m][kind].append(s)
    kinds = list(dict.fromkeys(k for k, _ in ws))
    print("| tensor (per step) | M=1 ms | " + " | ".join(f"M={m}" for m in rows[1:]) + " |")
    print("|---|---:|" + "---:|" * (len(rows) - 1))
    for kind in [*kinds, "total"]:
        med = {m: statistics.median(times[m][kind]) if kind != "total" else
               statistics.median(sum(t) for t in zip(*times[m].values(), strict=True)) for m in rows}
        cols = " | ".join(f"{med[m] / med[1]:.2f}x" for m in rows[1:])
        print(f"| {kind} | {1e3 * med[1]:.2f} | {cols} |")
    print(f"| total ms | {1e3 * med[1]:.2f} | " + " | ".join(f"{1e3 * med[m]:.2f}" for m in rows[1:]) + " |")


if __name__ == "__main__":
    main()
