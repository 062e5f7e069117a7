"""Micro-benchmarks of the CPU plugin's LLM kernels: quantized / float GEMV bandwidth at the Qwen3-0.6B layer shapes,
prefill GEMM throughput, and attention. Prints GB/s (weight bytes read per second) and GOP/s.

    PYTHONPATH=plugins/cpu python benchmarks/llm_kernels.py [--threads 2] [--isa avx512]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from hetero.contract import quant
from hetero_cpu import _native

# (name, N, K) of one Qwen3-0.6B layer and its tied LM head
SHAPES = [("q_proj", 2048, 1024), ("k/v_proj", 1024, 1024), ("o_proj", 1024, 2048), ("gate/up", 3072, 1024),
          ("down", 1024, 3072), ("lm_head", 151936, 1024)]


def timeit(fn, min_time: float = 0.3) -> float:
    fn()
    reps, total = 0, 0.0
    times = []
    while total < min_time or reps < 5:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        times.append(dt)
        total += dt
        reps += 1
    return float(np.median(times))


def weight(fmt: quant.QuantFormat | quant.GgmlFormat | None, n: int, k: int, rng: np.random.Generator,
           wtype: str = "f32"):
    if fmt is None:
        w = rng.standard_normal((n, k)).astype(np.float32)
        if wtype == "f16":
            w = w.astype(np.float16)
        elif wtype == "bf16":
            w = quant.f32_to_bf16(w)
        return _native.llm_weights(w, wtype, k=k), w.nbytes
    blocks = rng.integers(0, 256, size=(n, fmt.blocks(k), fmt.block_bytes), dtype=np.uint8)
    if isinstance(fmt, quant.GgmlFormat):
        for at in fmt.f16_fields:  # moderate scales; the rest of each block is random
            blocks[..., at:at + 2] = np.frombuffer(np.float16(0.001).tobytes(), dtype=np.uint8)
        data = blocks.reshape(n, -1)
        return _native.llm_weights(data, fmt.wtype, k=k), data.nbytes
    blocks[..., 0:2] = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    if not fmt.symmetric:
        blocks[..., 2:4] = np.frombuffer(np.float16(-0.05).tobytes(), dtype=np.uint8)
    data = blocks.reshape(n, -1)
    return _native.llm_weights(data, fmt.wtype, fmt.block_size, fmt.symmetric, k), data.nbytes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isa", default=None)
    ap.add_argument("--formats", default="q4,q8,q4_asym,q4_k,q6_k,q5_0,f16",
                    help="hetero q4/q8 specs, GGUF types (q5_0, q5_1, q4_k, q5_k, q6_k) or f32/f16/bf16")
    ap.add_argument("--prefill", type=int, default=128, help="rows of the GEMM test (0: skip)")
    ap.add_argument("--cold", type=int, default=256, help="MiB of weight copies cycled through so that the GEMV reads "
                    "memory, not the L3 (0: one hot copy)")
    args = ap.parse_args()
    _native.set_num_threads(args.threads)
    if args.isa:
        _native.set_isa(args.isa)
    print(f"isa {_native.isa()} / llm {_native.llm_isa()}, threads {args.threads}")
    rng = np.random.default_rng(0)
    # The read roof measured now: a float32 GEMV over 256 MiB (one FMA per 4 bytes: bound by memory, not compute).
    big = rng.standard_normal((16384, 4096)).astype(np.float32)
    wbig = _native.llm_weights(big, "f32", k=4096)
    xb, ob = rng.standard_normal((1, 4096)).astype(np.float32), np.empty((1, 16384), np.float32)
    troof = timeit(lambda w=wbig: _native.llm_matmul(w, xb, ob))
    print(f"memory read roof now (f32 GEMV, 256 MiB): {big.nbytes / troof / 1e9:.1f} GB/s")
    del wbig
    for spec in args.formats.split(","):
        fmt = None if spec in ("f32", "f16", "bf16") else quant.GGML_FORMATS.get(spec) or quant.parse_quant(spec)
        total_bytes = total_time = 0.0
        print(f"\n{spec}: GEMV (M=1)  [GB/s of weights]" + (f"; GEMM M={args.prefill} [GOP/s]" if args.prefill else ""))
        for name, n, k in SHAPES:
            w, nbytes = weight(fmt, n, k, rng, spec)
            copies = [w] + [weight(fmt, n, k, rng, spec)[0] for _ in range(int(args.cold * 2**20 // nbytes))]
            x = rng.standard_normal((1, k)).astype(np.float32)
            out = np.empty((1, n), np.float32)

            def gemv(copies=copies, x=x, out=out):
                for c in copies:
                    _native.llm_matmul(c, x, out)

            t = timeit(gemv) / len(copies)
            line = (f"  {name:9s} {n:6d}x{k:<5d} {nbytes / 2**20:7.2f} MiB  {t * 1e6:8.1f} us  "
                    f"{nbytes / t / 1e9:6.1f} GB/s")
            if name != "lm_head":
                mult = 4 if name == "k/v_proj" else (2 if name == "gate/up" else 1)
                total_bytes += nbytes * mult
                total_time += t * mult
            if args.prefill and name != "lm_head":
                xm = rng.standard_normal((args.prefill, k)).astype(np.float32)
                om = np.empty((args.prefill, n), np.float32)
                tm = timeit(lambda w=w, xm=xm, om=om: _native.llm_matmul(w, xm, om))
                line += f"   GEMM {2 * n * k * args.prefill / tm / 1e9:7.1f} GOP/s"
            print(line)
        print(f"  one layer: {total_bytes / 2**20:.2f} MiB in {total_time * 1e3:.3f} ms = "
              f"{total_bytes / total_time / 1e9:.1f} GB/s")
    # attention decode / prefill
    for ctx in (128, 512, 2048):
        att = _native.LlmAttention(8, 128, 4096, True)
        q = rng.standard_normal((ctx, 16, 128)).astype(np.float32)
        k = rng.standard_normal((ctx, 8, 128)).astype(np.float32)
        out = np.empty((ctx, 16 * 128), np.float32)
        t = timeit(lambda att=att, q=q, k=k, out=out: att(q, k, k, 0, 128**-0.5, out), 0.2)
        q1, k1, o1 = q[:1].copy(), k[:1].copy(), out[:1].copy()
        td = timeit(lambda att=att, q1=q1, k1=k1, o1=o1, ctx=ctx: att(q1, k1, k1, ctx - 1, 128**-0.5, o1), 0.2)
        print(f"attention 16q/8kv x 128, f16 cache: prefill {ctx}: {t * 1e3:.2f} ms; "
              f"decode at {ctx}: {td * 1e6:.1f} us")


if __name__ == "__main__":
    main()
