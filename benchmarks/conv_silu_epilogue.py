"""The conv epilogue's SiLU alone, in ns an element: a depthwise 1x1 conv with weights 1 on an L2-resident map,
timed with and without activation="silu" (thread time, alternating, medians). Compare two builds by running it
under each one's PYTHONPATH (e.g. /work/base30/core:/work/base30/plugins/cpu)."""

from __future__ import annotations

import argparse
import time

import numpy as np

from hetero_cpu import _native


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--channels", type=int, default=16)
    ap.add_argument("--size", type=int, default=32, help="the map's side")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=1000)
    a = ap.parse_args()
    _native.set_num_threads(1)
    c = a.channels
    x = (np.random.default_rng(0).standard_normal((1, c, a.size, a.size)) * 3).astype(np.float32)
    w, b, out = np.ones((c, 1, 1, 1), np.float32), np.zeros(c, np.float32), np.empty_like(x)
    res: dict[str, list[float]] = {"none": [], "silu": []}
    for _ in range(a.rounds):
        for act in res:
            t = time.thread_time_ns()
            for _ in range(a.calls):
                _native.conv2d(x, w, b, out, group=c, activation=act)
            res[act].append((time.thread_time_ns() - t) / a.calls / x.size)
    m = {k: float(np.median(v)) for k, v in res.items()}
    print(f"none {m['none']:.3f}  silu {m['silu']:.3f}  the SiLU {m['silu'] - m['none']:.3f} ns an element")


if __name__ == "__main__":
    main()
