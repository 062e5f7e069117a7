"""The quantized GEMM tiles of the CPU plugin at M = 1-4, 8, 9, 11, 12, 16 activation rows (native:
benchmarks/native/qgemm_rows.cpp, built here against plugins/cpu/src): the tile the plugin runs for M rows (qgemm_mr,
qgemm_wide for 9-16 rows on VNNI, or qgemm_rows for 2-8 rows on AVX2 / AVX-512 without VNNI), thread CPU time on the
same packed q4_k / q6_k / q4_0 / q8_0 / q5_0 / q5_1 / q5_k weights in one process, one thread. Prints M = 1's time and
GB/s and each M's cost relative to M = 1; exits non-zero if any row of a tile differs in a bit from the one-row GEMV.
``--n 256`` keeps the weights in L2 (the compute cost alone).

``--base REV`` builds the same benchmark a second time against the kernel headers of git revision REV and runs the
two alternately (``--rounds`` times), printing both, new / base, and whether the one-row outputs are the same bits:
a before / after that a busy machine's drift affects alike.

``--stream-mib MIB --threads 1,2`` streams the one-row GEMV from memory instead: each thread runs it over its own
~MIB MiB of copies of the packed matrix on 2 MiB pages (as the plugin's repacked weights), the passes started
together; printed as GB/s of weight bytes per core and as a share of the native read probe
(benchmarks/read_bandwidth.py, 2 MiB pages) measured at the same thread count in the same rounds, alternated.
With ``--calls T`` the copies are instead calls as a decode step makes them: the threads share them, each copy cut in
T equal tasks a thread, task i on thread i % threads (the order a pool's threads that keep pace claim them in), a
barrier after each call; ``--calls 1`` is one contiguous range a thread per call (the cost of the calls' structure,
set against the plain stream).

    python benchmarks/qgemm_rows.py [--n 8960] [--k 1536] [--reps 15] [--isa avx512vnni] [--base main --rounds 5]
    python benchmarks/qgemm_rows.py --isa avx512vbmi --base HEAD --base-isa avx512vnni [--rounds 5]
    python benchmarks/qgemm_rows.py --isa avx512vnni --stream-mib 256 --threads 1,2 [--base main] [--rounds 3]
        [--clock cpu]
    python benchmarks/qgemm_rows.py --isa avx512vnni --n 2048 --k 1024 --stream-mib 128 --threads 2 --clock cpu \
        --calls 4
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "native" / "qgemm_rows.cpp"
NATIVE_HEADERS = [HERE / "native" / "bench_threads.hpp"]
INCLUDE = HERE.parent / "plugins" / "cpu" / "src"
AVX512 = ["-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mfma", "-mf16c"]
FLAGS = {"avx2": ["-mavx2", "-mfma", "-mf16c"], "avx512": ["-DROWS_AVX512", *AVX512],
         "avx512vnni": ["-DROWS_VNNI", "-mavx512vnni", *AVX512],
         "avx512vbmi": ["-DROWS_VBMI", "-mavx512vnni", "-mavx512vbmi", "-mgfni", *AVX512]}

# One run's result: format -> (n, k, bytes, seconds at M = 1, hash of the one-row outputs, {M: seconds})
Result = dict[str, tuple[int, int, int, float, str, dict[int, float]]]


def build(isa: str, include: Path) -> Path:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        raise SystemExit("qgemm_rows: no C++ compiler found (set CXX)")
    headers = [*NATIVE_HEADERS, *sorted(include.glob("*.hpp"))]
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in [SOURCE, *headers]) + isa.encode())
    exe = Path(tempfile.gettempdir()) / f"hetero-qgemm-rows-{isa}-{digest.hexdigest()[:12]}"
    if not exe.exists():
        tmp = exe.with_suffix(".tmp")
        subprocess.run([cxx, "-O3", "-std=c++17", "-pthread", *FLAGS[isa], f"-I{include}", str(SOURCE), "-o", str(tmp)],
                       check=True)
        tmp.replace(exe)
    return exe


def base_headers(rev: str) -> Path:
    """plugins/cpu/src of git revision rev, extracted into a temporary folder."""
    repo = HERE.parent
    data = subprocess.run(["git", "-C", str(repo), "archive", rev, "plugins/cpu/src"], check=True,
                          capture_output=True).stdout
    out = Path(tempfile.mkdtemp(prefix="hetero-qgemm-base-"))
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(out, filter="data")
    return out / "plugins" / "cpu" / "src"


def run(exe: Path, n: int, k: int, reps: int, stream_mib: int = 0, threads: int = 1, clock: str = "wall",
        calls: int = 0) -> Result:
    """One run of the binary; stream_mib > 0: the streamed one-row GEMV on `threads` threads (no M columns; bytes:
    all threads' per pass; clock "cpu": the seconds are the best pass's slowest thread's CPU time, not the median
    pass's wall time; calls > 0: each copy one call split in `calls` equal tasks a thread, a barrier after each)."""
    cmd = [str(exe), str(n), str(k), str(reps)] + ([str(stream_mib), str(threads)] if stream_mib > 0 else [])
    cmd += [str(calls)] if stream_mib > 0 and calls > 0 else []
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    res: Result = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) > 6 and f[6] == "cpu":  # streamed: "... cpu <seconds>"
            res[f[0]] = (int(f[1]), int(f[2]), int(f[3]), float(f[7] if clock == "cpu" else f[4]), f[5], {})
            continue
        res[f[0]] = (int(f[1]), int(f[2]), int(f[3]), float(f[4]), f[5],
                     {int(f[i]): float(f[i + 1]) for i in range(6, len(f), 2)})
    return res


def median_of(results: list[Result]) -> Result:
    out: Result = {}
    for fmt, (n, k, nbytes, _, digest, ms) in results[0].items():
        out[fmt] = (n, k, nbytes, statistics.median(r[fmt][3] for r in results), digest,
                    {m: statistics.median(r[fmt][5][m] for r in results) for m in ms})
    return out


def describe(res: Result) -> list[str]:
    lines = []
    for fmt, (n, k, nbytes, t1, _, ms) in res.items():
        cols = [f"M={m} {tm / t1:.2f}x" for m, tm in ms.items()]
        lines.append(f"  {fmt} {n}x{k}: M=1 {1e3 * t1:.3f} ms ({nbytes / t1 / 1e9:.1f} GB/s) | " + " | ".join(cols))
    return lines


def stream(args: argparse.Namespace, base: Path | None) -> None:
    """--stream-mib: per ISA and thread count, the streamed one-row GEMV of this tree (and of --base), alternated
    with the read probe over --rounds rounds; medians of the rounds."""
    from read_bandwidth import measure

    threads = [int(t) for t in args.threads.split(",")]
    for isa in args.isa or sorted(FLAGS):
        exes = {"this tree": build(isa, INCLUDE)}
        if base is not None:
            exes[f"base {args.base}"] = build(args.base_isa or isa, base)
        runs: dict[tuple[str, int], list[Result]] = {(name, t): [] for name in exes for t in threads}
        bound: dict[int, list[float]] = {t: [] for t in threads}
        for _ in range(args.rounds):
            for t in threads:
                bound[t].append(measure([t], mib=args.stream_mib, reps=5, rounds=1, clock=args.clock)[t]["best_2m"])
                for name, exe in exes.items():
                    runs[name, t].append(run(exe, args.n, args.k, args.reps, args.stream_mib, t, args.clock,
                                             args.calls))
        for t in threads:
            gbs = statistics.median(bound[t])
            print(f"{isa}, {t} thread{'s' if t > 1 else ''}: read probe {gbs:.1f} GB/s (2 MiB pages, median of rounds"
                  f"{', CPU time' if args.clock == 'cpu' else ''})")
            for name in exes:
                res = median_of(runs[name, t])
                cols = [f"{fmt} {nbytes / t1 / 1e9 / t:5.1f} GB/s/core ({100 * nbytes / t1 / 1e9 / gbs:3.0f}%)"
                        for fmt, (_, _, nbytes, t1, _, _) in res.items()]
                print(f"  {name:>16}: " + " | ".join(cols), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8960)
    parser.add_argument("--k", type=int, default=1536)
    parser.add_argument("--reps", type=int, default=15, help="passes per M within one run (the median is kept)")
    parser.add_argument("--isa", action="append", choices=sorted(FLAGS),
                        help="default: all (this CPU must run them)")
    parser.add_argument("--base", help="git revision whose kernel headers to compare against, alternated")
    parser.add_argument("--base-isa", choices=sorted(FLAGS),
                        help="build --base for this ISA instead of --isa (e.g. avx512vbmi against a revision that "
                             "only has avx512vnni; --base HEAD --base-isa X: this tree's ISA X against --isa)")
    parser.add_argument("--rounds", type=int, default=3, help="alternated runs of each build (with --base)")
    parser.add_argument("--stream-mib", type=int, default=0,
                        help="stream the one-row GEMV from ~MIB MiB of weights per thread (2 MiB pages)")
    parser.add_argument("--calls", type=int, default=0,
                        help="with --stream-mib: the threads share the copies, each copy one call split in CALLS "
                             "equal tasks a thread (task i on thread i %% T) with a barrier after it: a decode step's "
                             "GEMVs (the plugin's default split is 4)")
    parser.add_argument("--threads", default="1", help="comma-separated thread counts (with --stream-mib)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="with --stream-mib: cpu = each pass timed by its slowest thread's CPU time, the tiles' "
                             "best pass and the probe's (a busy machine: without the time a thread was descheduled)")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}")
    base = base_headers(args.base) if args.base else None
    if args.stream_mib > 0:
        stream(args, base)
        print(f"load average {os.getloadavg()[0]:.2f}")
        return
    for isa in args.isa or sorted(FLAGS):
        new_exe = build(isa, INCLUDE)
        if base is None:
            print(f"{isa}:", flush=True)
            print("\n".join(describe(run(new_exe, args.n, args.k, args.reps))), flush=True)
            continue
        base_exe = build(args.base_isa or isa, base)
        news, bases = [], []
        for _ in range(args.rounds):
            bases.append(run(base_exe, args.n, args.k, args.reps))
            news.append(run(new_exe, args.n, args.k, args.reps))
        new, old = median_of(news), median_of(bases)
        print(f"{isa} base {args.base}{' ' + args.base_isa if args.base_isa else ''}:")
        print("\n".join(describe(old)))
        print(f"{isa} this tree:")
        print("\n".join(describe(new)))
        print(f"{isa} this tree / base (time):")
        for fmt, (_, _, _, t1, digest, ms) in new.items():
            o = old[fmt]
            cols = [f"M={m} {tm / o[5][m]:.2f}" for m, tm in ms.items()]
            same = "same bits" if digest == o[4] else "other bits"
            print(f"  {fmt}: M=1 {t1 / o[3]:.2f} | " + " | ".join(cols) + f" | M=1 output {same} as base", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
