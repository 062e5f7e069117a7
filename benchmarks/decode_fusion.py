"""The decode step's fused native calls against the unfused ones, on one decoder layer's shapes (hetero_cpu.fuse).

    PYTHONPATH=core:plugins/cpu python benchmarks/decode_fusion.py [--threads 1,2] [--layers 8] [--reps 300]

A layer's one-row calls: q, k, v, gate, up, SwiGLU, down, residual Add (unfused: 8 calls, 5 parallel regions) and
``llm_matmul_multi`` + ``llm_matmul_swiglu`` + ``llm_matmul_residual`` (fused: 3 calls, 3 regions), in Qwen2.5-1.5B's
shapes and Q4_K_M's types (q4_k q / k / gate / up, q6_k v / down; random blocks). ``--layers`` copies of the layer
are cycled so the weights stream from memory rather than the cache (8 x ~25 MiB). Both run alternately ``--reps``
times per thread count; printed: min / p10 / median ms per layer and the GB/s of the min. On a busy machine read
the minimum: a neighbour only adds time.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from hetero.contract import quant
from hetero_cpu import _native


def ggml_weights(wtype: str, n: int, k: int, seed: int):
    fmt = quant.GGML_FORMATS[wtype]
    r = np.random.default_rng(seed)
    raw = r.integers(0, 256, (n, fmt.blocks(k), fmt.block_bytes), dtype=np.uint8)
    for at in fmt.f16_fields:
        scales = (r.standard_normal((n, fmt.blocks(k))) * 0.02).astype(np.float16)
        raw[..., at:at + 2] = scales[..., None].view(np.uint8)
    return _native.llm_weights(raw.reshape(n, fmt.row_bytes(k)), wtype, k=k)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--layers", type=int, default=8, help="layer copies cycled through (cache-cold weights)")
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--hidden", type=int, default=1536)
    ap.add_argument("--inter", type=int, default=8960)
    ap.add_argument("--kv", type=int, default=256, help="rows of k and v")
    args = ap.parse_args()
    h, i, kv = args.hidden, args.inter, args.kv
    layers = [dict(q=ggml_weights("q4_k", h, h, 6 * s), k=ggml_weights("q4_k", kv, h, 6 * s + 1),
                   v=ggml_weights("q6_k", kv, h, 6 * s + 2), g=ggml_weights("q4_k", i, h, 6 * s + 3),
                   u=ggml_weights("q4_k", i, h, 6 * s + 4), d=ggml_weights("q6_k", h, i, 6 * s + 5))
              for s in range(args.layers)]
    nbytes = sum(w.nbytes for w in layers[0].values())
    x = np.random.default_rng(0).standard_normal((1, h)).astype(np.float32)
    q, k, v, d, res = (np.empty((1, n), np.float32) for n in (h, kv, kv, h, h))
    g, u, a = (np.empty((1, i), np.float32) for _ in range(3))

    def unfused(w: dict) -> None:
        _native.llm_matmul(w["q"], x, q, None)
        _native.llm_matmul(w["k"], x, k, None)
        _native.llm_matmul(w["v"], x, v, None)
        _native.llm_matmul(w["g"], x, g, None)
        _native.llm_matmul(w["u"], x, u, None)
        _native.llm_swiglu(g, u, a)
        _native.llm_matmul(w["d"], a, d, None)
        _native.binary("add", x, d, res)

    def fused(w: dict) -> None:
        _native.llm_matmul_multi([w["q"], w["k"], w["v"]], x, [q, k, v], [None, None, None])
        _native.llm_matmul_swiglu(w["g"], w["u"], x, g, u, a, None, None)
        _native.llm_matmul_residual(w["d"], a, d, None, x, res)

    print(f"one layer: {nbytes / 2**20:.1f} MiB of weights, {args.layers} copies cycled; "
          f"ISA {_native.isa()}; load average {os.getloadavg()[0]:.2f}")
    for threads in [int(t) for t in args.threads.split(",")]:
        _native.set_num_threads(threads)
        times: dict[str, list[float]] = {"unfused": [], "fused": []}
        for r in range(args.reps):
            w = layers[r % len(layers)]
            order = (("unfused", unfused), ("fused", fused)) if r % 2 else (("fused", fused), ("unfused", unfused))
            for name, fn in order:
                t0 = time.perf_counter()
                fn(w)
                times[name].append(time.perf_counter() - t0)
        for name, ts in times.items():
            ts.sort()
            print(f"  {threads} thread(s) {name:8s}: min {ts[0] * 1e3:.3f} ms ({nbytes / ts[0] / 1e9:.1f} GB/s), "
                  f"p10 {ts[len(ts) // 10] * 1e3:.3f}, median {ts[len(ts) // 2] * 1e3:.3f} ms")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
