"""The cpu plugin's GEMMs at 1 thread against this core's multiply-add peak: "is it at the vpdpbusd / FMA peak?"
per shape. The peak is measured here (native: benchmarks/native/vector_peak.cpp, 16 independent 512-bit vpdpbusd or
FMA chains, built with the system C++ compiler; AVX-512 VNNI machines only): 64 MACs a vpdpbusd, 16 an FMA.

    python benchmarks/gemm_peak.py [--op qgemm] [--shapes 70x512x384,70x384x512,70x512x1024,70x1024x512]
    python benchmarks/gemm_peak.py --op gemm --shapes 882x256x200,630x384x100
    python benchmarks/gemm_peak.py --k-sweep 72x1024:128,256,512,1024

--k-sweep MxN:K,K,...: one M x N product at several depths, hot, the depths interleaved set by set in one process (a
busy machine's drift then hits every depth alike), and the line time = slope K + intercept fitted through their
medians: the slope is the tile loop's rate (MACs of the whole product a K step, as % of the peak), the intercept the
part of a call that does not grow with K (a tile's start and output stage, the call's own cost), with its share of
each depth's time.

--op qgemm: ``_native.qgemm_f32`` (uint8 A, a DynamicQuantizeLinear's one zero point, int8 B with zero point 0:
T5's quantized products; the default shapes are its q / k / v, o, wi and wo). --op gemm: ``_native.gemm_packed``
(fp32, a column bias and ReLU in the epilogue: a Conv1D's product). Each shape is timed "hot" (one B, in L2 after
the first call) and "cold" (--cold different Bs in turn, as a model's weights arrive from L3 or memory). Thread CPU
time, the native pool at 1 thread; medians of --reps sets of --calls calls; the peak is the best of its reps (on a
shared machine a neighbour only ever subtracts). The load average is printed.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).resolve().parent / "native" / "vector_peak.cpp"
FLAGS = ["-mavx512f", "-mavx512bw", "-mavx512vnni"]


def has_vnni() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512f" in flags and "avx512_vnni" in flags


def build() -> Path:
    """The probe's binary, compiled once per source version into the temp directory."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        raise SystemExit("gemm_peak: no C++ compiler found (set CXX)")
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    exe = Path(tempfile.gettempdir()) / f"hetero-vector-peak-{digest}"
    if not exe.exists():
        tmp = exe.with_suffix(".tmp")
        subprocess.run([cxx, "-O2", "-std=c++17", *FLAGS, str(SOURCE), "-o", str(tmp)], check=True)
        tmp.replace(exe)
    return exe


def peak_macs_per_s(reps: int = 5, iterations: int = 20_000_000) -> dict[str, float]:
    """{"qgemm": int8 MACs / s, "gemm": fp32 MACs / s}: the best rep of each probe."""
    out = subprocess.run([str(build()), str(iterations), str(reps)], check=True, capture_output=True, text=True)
    rec = json.loads(out.stdout)
    return {"qgemm": 64 * max(rec["dpbusd_per_s"]), "gemm": 16 * max(rec["fma_per_s"])}


def calls_for(op: str, m: int, k: int, n: int, weights: int, rng: np.random.Generator) -> list[Callable[[], None]]:
    """One bound call per weight matrix (``weights`` different Bs), every one on the same A and output."""
    from hetero_cpu import _native

    out = np.empty((m, n), np.float32)
    if op == "qgemm":
        a = rng.integers(0, 256, (m, k), dtype=np.uint8)
        scale, zp = np.array([1e-3], np.float32), np.array(3, np.uint8)
        packs = [_native.qpack_b(rng.integers(-128, 128, (k, n), dtype=np.int8), np.array(0, np.int8))
                 for _ in range(weights)]
        return [functools.partial(_native.qgemm_f32, a, p, zp, scale, None, out, None, None) for p in packs]
    x = rng.standard_normal((m, k), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    packs = [_native.pack_b(rng.standard_normal((k, n), dtype=np.float32), False, True, "high")
             for _ in range(weights)]
    return [functools.partial(_native.gemm_packed, x, p, out, 1.0, 0.0, bias, "relu") for p in packs]


def time_calls(calls: list[Callable[[], None]], per_set: int, reps: int) -> float:
    """Median seconds a call over reps sets of per_set calls, the calls taken in turn."""
    for call in calls[:2]:
        call()
    sets, j = [], 0
    for _ in range(reps):
        t0 = time.thread_time()
        for _ in range(per_set):
            calls[j % len(calls)]()
            j += 1
        sets.append((time.thread_time() - t0) / per_set)
    return statistics.median(sets)


def k_sweep(op: str, spec: str, calls_per_set: int, reps: int, peak: float | None) -> None:
    """Times M x K x N at each K of ``spec`` ("MxN:K,K,..."), hot and interleaved, and prints the fitted line."""
    dims, depths = spec.lower().split(":")
    m, n = (int(v) for v in dims.split("x"))
    ks = [int(v) for v in depths.split(",")]
    if len(ks) < 2:
        raise SystemExit("gemm_peak: --k-sweep needs two depths or more")
    rng = np.random.default_rng(0)
    calls = [calls_for(op, m, k, n, 1, rng)[0] for k in ks]
    for call in calls:
        call()
    sets: list[list[float]] = [[] for _ in ks]
    for _ in range(reps):
        for i, call in enumerate(calls):
            t0 = time.thread_time()
            for _ in range(calls_per_set):
                call()
            sets[i].append((time.thread_time() - t0) / calls_per_set)
    secs = [statistics.median(v) for v in sets]
    slope, intercept = np.polyfit(np.array(ks, float), np.array(secs), 1)
    for k, s in zip(ks, secs, strict=True):
        rate = m * k * n / s
        share = f"  {100 * rate / peak:5.1f} % of peak" if peak else ""
        print(f"  {op} {m}x{k}x{n:<6d} {s * 1e6:8.1f} us  {rate / 1e9:6.1f} GMAC/s{share}"
              f"  K-independent part {100 * intercept / s:4.1f} %")
    loop = m * n / slope
    share = f" ({100 * loop / peak:.1f} % of peak)" if peak else ""
    print(f"  fit: {slope * 1e9:.3f} ns a K step = {loop / 1e9:.1f} GMAC/s{share}; {intercept * 1e6:.2f} us a call "
          "that does not grow with K")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", choices=("qgemm", "gemm"), default="qgemm")
    ap.add_argument("--shapes", default="70x512x384,70x384x512,70x512x1024,70x1024x512", help="MxKxN,...")
    ap.add_argument("--cold", type=int, default=48, help="different weight matrices taken in turn for 'cold'")
    ap.add_argument("--calls", type=int, default=20, help="calls per timed set")
    ap.add_argument("--reps", type=int, default=15, help="timed sets per shape and case")
    ap.add_argument("--k-sweep", default="", help="MxN:K,K,...: the product's time against its depth (see above)")
    args = ap.parse_args()
    from hetero_cpu import _native

    _native.set_num_threads(1)  # thread time counts the calling thread only: the pool's other threads stay idle
    load_before = os.getloadavg()
    peak = peak_macs_per_s()[args.op] if has_vnni() else None
    if args.k_sweep:
        print(f"load average before {load_before[0]:.2f} (1 min)")
        if peak is not None:
            print(f"peak (1 core): {peak / 1e9:.1f} GMAC/s")
        k_sweep(args.op, args.k_sweep, args.calls, args.reps, peak)
        print(f"load average after {os.getloadavg()[0]:.2f} (1 min)")
        return
    rng = np.random.default_rng(0)
    rows = []
    for shape in args.shapes.split(","):
        m, k, n = (int(v) for v in shape.lower().split("x"))
        macs = m * k * n
        calls = calls_for(args.op, m, k, n, args.cold, rng)
        for case, subset in (("hot", calls[:1]), ("cold", calls)):
            s = time_calls(subset, args.calls, args.reps)
            rows.append((shape, case, s, macs / s))
    print(f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f} (1 min)")
    if peak is None:
        print("peak: not measured (the probe needs AVX-512 VNNI)")
    else:
        what = "vpdpbusd zmm x 64" if args.op == "qgemm" else "FMA zmm x 16"
        print(f"peak ({what}, 1 core): {peak / 1e9:.1f} GMAC/s")
    for shape, case, s, rate in rows:
        share = f"  {100 * rate / peak:5.1f} % of peak" if peak else ""
        print(f"  {args.op} {shape:>14s} {case:4s} {s * 1e6:8.1f} us  {rate / 1e9:6.1f} GMAC/s{share}")


if __name__ == "__main__":
    main()
