"""GFLOP/s of hetero's native CPU matmul against numpy (BLAS), as a markdown table.

Shapes (M x K x N): 1x1024x4096 (decode GEMV: one token through a 1024 -> 4096 projection) and 512x1024x1024
(prefill-sized GEMM), each at 1 and 2 threads, with B packed ahead of time (weights: ``pack_b`` once, then
``gemm_packed``) and unpacked (``gemm`` packs B inside the call). Times are medians of interleaved runs, so
background load hits both sides alike; the ratio column is hetero / numpy.

Each thread count runs in a fresh subprocess with OPENBLAS_NUM_THREADS / OMP_NUM_THREADS / MKL_NUM_THREADS /
HETERO_NUM_THREADS set, because BLAS libraries read their thread count at load time.

Fair comparison: some environments export OPENBLAS_CORETYPE (e.g. to pin an older kernel for reproducibility),
which makes numpy's OpenBLAS run a slower code path than the CPU supports. Unset it before running:

    env -u OPENBLAS_CORETYPE python benchmarks/matmul.py

(the script warns when it is set). Run on a quiet machine; the numbers in a shared session are noisy.

``--precision`` instead compares the packed GEMM's two precisions on a transformer encoder's weight shapes
(MiniLM: M = tokens, K x N = 384 x 384, 384 x 1536, 1536 x 384): ``pack_b(precision="high")`` (the fp32 kernels)
against ``"normal"`` (bf16x3 on AMX-BF16 where the CPU has it, docs/onnx-models.md), interleaved, with the largest
error of each against a float64 product relative to sum |a| |b|.

``--panels [--clock thread]`` times the fp32 packed GEMM on fp32 against int8 weight panels (``pack_b``'s exact
int8 form of a weight that is int8 values times a scale) on transformer / LSTM weight shapes (docs/onnx-models.md,
"fp32 GEMM on Zen 4").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SHAPES = [(1, 1024, 4096), (512, 1024, 1024)]
# Transformer / LSTM weight products of issue 17's models (captcha_crnn's LSTM input projection, MiniLM, khmer)
PANEL_SHAPES = [(20, 4096, 400), (64, 384, 1536), (64, 1536, 384), (66, 768, 192), (128, 384, 384),
                (128, 384, 1536), (128, 1536, 384)]
PRECISION_SHAPES = [(m, k, n) for m in (16, 32, 64, 128, 256) for k, n in ((384, 384), (384, 1536), (1536, 384))]


def _time_interleaved(fns: dict, reps: int, min_time: float, clock=time.perf_counter) -> dict:
    """Median seconds per call of each function, alternating between them every repetition."""
    import numpy as np  # noqa: F401  (loaded before timing)

    inner = {}
    for name, fn in fns.items():
        fn()  # warm-up: packing buffers, thread pool, page faults
        t0 = clock()
        fn()
        dt = max(clock() - t0, 1e-7)
        inner[name] = max(1, int(min_time / dt))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            n = inner[name]
            t0 = clock()
            for _ in range(n):
                fn()
            samples[name].append((clock() - t0) / n)
    return {name: statistics.median(v) for name, v in samples.items()}


def worker(threads: int, reps: int) -> list[dict]:
    import numpy as np

    from hetero_cpu import _native

    _native.set_num_threads(threads)
    rng = np.random.default_rng(0)
    rows = []
    for m, k, n in SHAPES:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        out_h = np.empty((m, n), np.float32)
        out_np = np.empty((m, n), np.float32)
        packed = _native.pack_b(b)
        fns = {
            "numpy": lambda a=a, b=b, o=out_np: np.matmul(a, b, out=o),
            "packed": lambda a=a, p=packed, o=out_h: _native.gemm_packed(a, p, o),
            "unpacked": lambda a=a, b=b, o=out_h: _native.gemm(a, b, o),
        }
        med = _time_interleaved(fns, reps, min_time=0.02)
        flops = 2.0 * m * k * n
        for variant in ("packed", "unpacked"):
            rows.append(
                {
                    "shape": f"{m}x{k}x{n}",
                    "threads": threads,
                    "variant": variant,
                    "hetero": flops / med[variant] / 1e9,
                    "numpy": flops / med["numpy"] / 1e9,
                }
            )
    return rows


def precision_worker(threads: int, reps: int) -> list[dict]:
    import numpy as np

    from hetero_cpu import _native

    _native.set_num_threads(threads)
    rng = np.random.default_rng(0)
    rows = []
    for m, k, n in PRECISION_SHAPES:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        outs = {p: np.empty((m, n), np.float32) for p in ("high", "normal")}
        packs = {p: _native.pack_b(b, precision=p) for p in outs}
        fns = {p: lambda a=a, q=packs[p], o=outs[p]: _native.gemm_packed(a, q, o) for p in outs}
        med = _time_interleaved(fns, reps, min_time=0.02)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
        flops = 2.0 * m * k * n
        rows.append({"shape": f"{m}x{k}x{n}", "threads": threads, "bf16x3": packs["normal"].bf16x3,
                     **{p: flops / med[p] / 1e9 for p in outs},
                     **{f"err_{p}": float(np.max(np.abs(outs[p] - ref) / scale)) for p in outs}})
    return rows


def panels_worker(threads: int, reps: int, clock_name: str) -> list[dict]:
    """fp32 against int8 weight panels (pack_b's exact int8 form, made floats a panel at a time) in the fp32 GEMM."""
    import numpy as np

    from hetero_cpu import _native

    _native.set_num_threads(threads)
    clock = time.thread_time if clock_name == "thread" else time.perf_counter
    rng = np.random.default_rng(0)
    rows = []
    for m, k, n in PANEL_SHAPES:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.integers(-127, 128, (k, n)).astype(np.float32) * np.float32(0.0123)  # int8 values times a scale
        packs = {"fp32": _native.pack_b(b, int8=False, precision="high"),
                 "int8": _native.pack_b(b, int8=True, precision="high")}
        out = np.empty((m, n), np.float32)
        fns = {p: lambda a=a, q=packs[p], o=out: _native.gemm_packed(a, q, o) for p in packs}
        med = _time_interleaved(fns, reps, min_time=0.01, clock=clock)
        flops = 2.0 * m * k * n
        rows.append({"shape": f"{m}x{k}x{n}", "threads": threads, "int8_panels": packs["int8"].int8,
                     **{p: flops / med[p] / 1e9 for p in packs}})
    return rows


def print_panels(rows: list[dict]) -> None:
    print("| shape (MxKxN) | threads | fp32 panels GFLOP/s | int8 panels GFLOP/s |")
    print("|---|---:|---:|---:|")
    for r in rows:
        int8 = f"{r['int8']:.1f}" if r["int8_panels"] else "(not int8)"
        print(f"| {r['shape']} | {r['threads']} | {r['fp32']:.1f} | {int8} |")


def print_precision(rows: list[dict]) -> None:
    print("| shape (MxKxN) | threads | high (fp32) GFLOP/s | normal GFLOP/s | normal/high | bf16x3 | "
          "max err / sum|a||b|: high | normal |")
    print("|---|---:|---:|---:|---:|---|---:|---:|")
    for r in rows:
        print(f"| {r['shape']} | {r['threads']} | {r['high']:.1f} | {r['normal']:.1f} | "
              f"{r['normal'] / r['high']:.2f} | {'yes' if r['bf16x3'] else 'no'} | {r['err_high']:.1e} | "
              f"{r['err_normal']:.1e} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--reps", type=int, default=15, help="interleaved repetitions per measurement")
    ap.add_argument("--precision", action="store_true", help="fp32 against bf16x3 on MiniLM's weight shapes")
    ap.add_argument("--panels", action="store_true",
                    help="fp32 against int8 weight panels on transformer / LSTM weight shapes")
    ap.add_argument("--clock", choices=("wall", "thread"), default="wall",
                    help="--panels: wall time, or the calling thread's CPU time (1 thread on a busy machine)")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker is not None:
        if args.panels:
            print(json.dumps(panels_worker(args.worker, args.reps, args.clock)))
        else:
            print(json.dumps((precision_worker if args.precision else worker)(args.worker, args.reps)))
        return

    if os.environ.get("OPENBLAS_CORETYPE"):
        print(
            f"warning: OPENBLAS_CORETYPE={os.environ['OPENBLAS_CORETYPE']} is set; numpy's BLAS may not use its best "
            "kernel. Re-run with `env -u OPENBLAS_CORETYPE python benchmarks/matmul.py` for a fair comparison.\n",
            file=sys.stderr,
        )
    rows = []
    for t in (int(x) for x in args.threads.split(",")):
        env = dict(os.environ)
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "HETERO_NUM_THREADS"):
            env[var] = str(t)
        res = subprocess.run(
            [sys.executable, __file__, "--worker", str(t), "--reps", str(args.reps)]
            + (["--precision"] if args.precision else [])
            + (["--panels", "--clock", args.clock] if args.panels else []),
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        rows.extend(json.loads(res.stdout.strip().splitlines()[-1]))

    from hetero_cpu import _native

    if args.panels:
        print(f"load average {os.getloadavg()[0]:.2f}; clock {args.clock}\n")
        print_panels(rows)
        return
    if args.precision:
        print(f"load average {os.getloadavg()[0]:.2f}; bf16x3 available: {_native.bf16x3_available()}\n")
        print_precision(rows)
        return
    print(f"hetero isa: {_native.isa()}  (numpy {__import__('numpy').__version__})\n")
    print("| shape (MxKxN) | threads | B | hetero GFLOP/s | numpy GFLOP/s | hetero/numpy |")
    print("|---|---:|---|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['shape']} | {r['threads']} | {r['variant']} | {r['hetero']:.1f} | {r['numpy']:.1f} | "
            f"{r['hetero'] / r['numpy']:.2f} |"
        )


if __name__ == "__main__":
    main()
