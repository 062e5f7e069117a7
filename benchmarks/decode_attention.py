"""One decode step's attention per layer, with the KV cache cold as in a real step: Qwen3-0.6B shapes by default
(28 layers, 16 query / 8 kv heads of 128, float16 cache), every layer's cache filled with ``--ctx`` positions, then
each layer's one-token call timed after a sweep of ``--sweep-mib`` (the weights a step streams between two layers'
attention), and again without the sweep (``warm``: the other layers' caches only), and one layer called again and
again (``same layer``: its cache in L2, the arithmetic alone).

    python benchmarks/decode_attention.py --threads 1 --ctx 64
    HETERO_LLM_KVTOUCH=0 python benchmarks/decode_attention.py --threads 1 --ctx 64   # without the KV read-ahead

At 1 thread the calls are timed in the thread's CPU time (a neighbour taking the core away does not count), at more
in wall time. Each figure includes the call's Python binding (~1.5 us). docs/llm-benchmarks.md (dec16) has results.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=64, help="cached positions before each timed call")
    ap.add_argument("--reps", type=int, default=20, help="passes over the layers")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--kv-dtype", default="f16")
    ap.add_argument("--sweep-mib", type=float, default=9.0, help="MiB read between two layers' calls (cold)")
    args = ap.parse_args()

    from hetero_cpu import _native

    _native.set_num_threads(args.threads)
    clock = time.thread_time_ns if args.threads == 1 else time.perf_counter_ns
    hq, hkv, d, ctx = args.heads, args.kv_heads, args.head_dim, args.ctx
    rng = np.random.default_rng(0)
    caches = [_native.LlmAttention(hkv, d, ctx + 584, args.kv_dtype) for _ in range(args.layers)]
    for cache in caches:
        q, k, v = (rng.standard_normal((ctx, h, d), dtype=np.float32) for h in (hq, hkv, hkv))
        cache(q, k, v, 0, 0.088, np.empty((ctx, hq * d), np.float32))
    q1, k1, v1 = (rng.standard_normal((1, h, d), dtype=np.float32) for h in (hq, hkv, hkv))
    out = np.empty((1, hq * d), np.float32)
    per_layer = max(1, int(args.sweep_mib * 2**20 / 4))
    sweep = np.ones(per_layer * args.layers, np.float32)

    def call(cache) -> int:
        t0 = clock()
        cache(q1, k1, v1, ctx, 0.088, out)  # rolled back to ctx each time: every call sees the same context
        return clock() - t0

    cold: list[int] = []
    warm: list[int] = []
    for _ in range(args.reps):
        for i, cache in enumerate(caches):
            sweep[i * per_layer:(i + 1) * per_layer].sum()
            cold.append(call(cache))
        warm.extend(call(cache) for cache in caches)
    same = [call(caches[0]) for _ in range(args.reps * args.layers)]
    kv = 2 * hkv * d * (2 if args.kv_dtype == "f16" else 4) * (ctx + 1)
    print(f"{args.layers} layers, {hq} / {hkv} heads of {d}, {args.kv_dtype}, {ctx} cached positions "
          f"({kv / 1024:.0f} KiB of K and V a layer), {args.threads} thread(s)")
    print("| cache | median us | p10 us | min us |")
    print("|---|---:|---:|---:|")
    for name, xs in (("cold", cold), ("warm", warm), ("same layer", same)):
        a = np.array(xs) / 1e3
        print(f"| {name} | {np.median(a):.1f} | {np.percentile(a, 10):.1f} | {a.min():.1f} |")


if __name__ == "__main__":
    main()
